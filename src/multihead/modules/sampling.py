"""Next-token choice from logits: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

import torch
from torch import Tensor


def check_sampling(
    max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None
) -> None:
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


def sample(
    logits: Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """logits (B, V) -> tokens (B,)."""
    if temperature == 0:  # max's indices are argmax's (the first of ties; NaN counts as the
        # largest), and on CPU max(-1) reads a 49k-logit row in ~40 us where argmax takes ~100
        return logits.max(-1).indices
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass.
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
