"""The logit lens (nostalgebraist 2020) for causal LMs: what each block's residual stream would
predict if the model stopped there, read through the final norm and the unembedding.

    lens = logit_lens(model, ids)
    lens.loss            # (L,) next-token loss of each block's prediction
    lens.top_tokens      # (L, B, T, k) the k most likely next tokens per block and position
    print(lens.table(decode=tokenizer.id_to_token))

The last block's prediction is the model's own. Shapes: input_ids (B, T); L blocks; V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hooked.hooks import act_name, run_with_cache, unwrap
from ..table import format_table


@dataclass(frozen=True)
class LensResult:
    top_tokens: Tensor  # (L, B, T, k) token ids, most likely first
    top_probs: Tensor  # (L, B, T, k) their probabilities
    token_loss: Tensor  # (L, B, T - 1): -log p(token t + 1) read at position t
    loss: Tensor  # (L,) token_loss averaged over real (unpadded) positions
    logits: Tensor | None = None  # (L, B, T, V) when asked for (keep_logits=True)

    def table(
        self,
        *,
        batch: int = 0,
        position: int = -1,
        decode: Callable[[int], str] | None = None,
    ) -> str:
        """Per block: the top tokens at one position (with probabilities) and the loss."""
        show = decode or str
        rows = []
        for layer in range(self.top_tokens.shape[0]):
            ids = self.top_tokens[layer, batch, position].tolist()
            probs = self.top_probs[layer, batch, position].tolist()
            tops = "  ".join(f"{show(i)} {p:.2f}" for i, p in zip(ids, probs, strict=True))
            rows.append([f"block {layer}", f"{float(self.loss[layer]):.3f}", tops])
        return format_table(["resid_post", "loss", f"top tokens at position {position}"], rows)

    def __str__(self) -> str:
        return self.table()


def is_lens_model(model: nn.Module) -> bool:
    """A causal LM as the lens reads it: `layers` (blocks.{i}.hook_resid_post), a final norm
    `norm_f` and `logits(h)` (a `CausalLM`, or a bridged transformers causal LM)."""
    return (
        isinstance(getattr(model, "layers", None), nn.ModuleList)
        and isinstance(getattr(model, "norm_f", None), nn.Module)
        and callable(getattr(model, "logits", None))
        and getattr(getattr(model, "config", None), "causal", True) is not False
    )


def logit_lens(
    model: nn.Module,
    input_ids: Tensor,
    *,
    attention_mask: Tensor | None = None,
    top_k: int = 5,
    keep_logits: bool = False,
) -> LensResult:
    """Each block's `hook_resid_post` through the final norm (`ln_final`) and the output head.

    `attention_mask` (B, T), 1 = token: padded positions are left out of the loss (as targets
    and as predictors). `top_k`: how many tokens to keep per block and position. The loss of
    block i is the mean cross-entropy of the next token, as the model's own loss is for the last
    block.
    """
    lm: Any = unwrap(model)
    if not is_lens_model(lm):
        raise TypeError(f"the logit lens reads a CausalLM's blocks, got {type(lm).__name__}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    if input_ids.dim() != 2 or input_ids.shape[1] < 2:
        raise ValueError(
            f"input_ids must be (B, T) with T >= 2 (a next token to predict), "
            f"got {tuple(input_ids.shape)}"
        )
    L = len(lm.layers)
    names = [act_name("resid_post", i) for i in range(L)]
    with torch.no_grad():
        _, cache = run_with_cache(lm, input_ids, attention_mask=attention_mask, names=names)
        real = (
            torch.ones_like(input_ids, dtype=torch.bool)
            if attention_mask is None
            else attention_mask.bool()
        )
        counted = (real[:, :-1] & real[:, 1:]).float()  # a real token predicting a real one
        tops, probs, losses, kept = [], [], [], []
        for name in names:
            logits = lm.logits(lm.norm_f(cache[name])).float()  # (B, T, V)
            p, ids = logits.softmax(-1).topk(min(top_k, logits.shape[-1]), dim=-1)
            tops.append(ids)
            probs.append(p)
            loss = F.cross_entropy(
                logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none"
            )  # (B, V, T - 1) -> (B, T - 1)
            losses.append(loss * counted)
            if keep_logits:
                kept.append(logits)
        token_loss = torch.stack(losses)
        mean_loss = token_loss.sum((1, 2)) / counted.sum().clamp(min=1)
    return LensResult(
        torch.stack(tops),
        torch.stack(probs),
        token_loss,
        mean_loss,
        torch.stack(kept) if keep_logits else None,
    )
