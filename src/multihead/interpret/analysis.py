"""Run a pretrained encoder on texts and measure its heads: the glue between a model and the
pure metrics. Each text runs alone (no padding), under `capture`."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .capture import capture
from .metrics import copy_scores, corpus_metrics
from .roles import HeadRole, head_roles


@dataclass
class TextAttention:
    tokens: list[str]
    attn: Tensor  # (L, H, T, T)


@dataclass
class Analysis:
    texts: list[TextAttention]
    metrics: dict[str, Tensor]  # name -> (L, H)
    roles: list[list[list[HeadRole]]]

    @property
    def shape(self) -> tuple[int, int]:
        L, H = self.metrics["previous"].shape
        return L, H


def _attention_of(encoder, ids: list[int]) -> Tensor:
    """(L, H, T, T) weights of one unpadded token sequence, via `capture`."""
    with torch.inference_mode(), capture(encoder, keep_qkv=False) as records:
        encoder(torch.tensor([ids]))
    return torch.stack([r.weights[0] for r in records])


def text_attention(encoder, text: str) -> TextAttention:
    """Token strings and per-layer weights (L, H, T, T) of one text, via `capture`."""
    ids = encoder.tokenize([text])[0]
    attn = _attention_of(encoder, ids).float()  # (L, H, T, T)
    tokens = [encoder.tokenizer.id_to_token(i) or f"<{i}>" for i in ids]
    return TextAttention(tokens, attn)


def copy_probe(
    encoder, *, length: int = 16, trials: int = 8, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Duplicate-token and induction scores (L, H) on [CLS] R filler R [SEP], R random tokens.

    The filler's length is random (1 .. length) in each trial, so a head attending at a fixed
    offset cannot score as an induction head by matching the period.
    """
    rng = random.Random(seed)
    tok = encoder.tokenizer
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    vocab = tok.get_vocab_size()
    # ordinary word pieces only: skip the reserved/special block at the start of BERT vocabularies
    low = min(1000, vocab // 2)
    dup_total: Tensor | int = 0
    ind_total: Tensor | int = 0
    for _ in range(trials):
        seq = [rng.randrange(low, vocab) for _ in range(length)]
        filler = [rng.randrange(low, vocab) for _ in range(rng.randint(1, length))]
        ids = [cls_id, *seq, *filler, *seq, sep_id]
        attn = _attention_of(encoder, ids)
        dup, ind = copy_scores(attn, 1, 1 + length + len(filler), length)
        dup_total = dup_total + dup
        ind_total = ind_total + ind
    return dup_total / trials, ind_total / trials  # type: ignore[return-value]


def analyze(
    encoder,
    texts: Sequence[str],
    *,
    probe: bool = True,
    progress: Callable[[Sequence[str]], Sequence[str]] | None = None,
) -> Analysis:
    """Metrics of every head averaged over `texts`, plus the repeated-token probe, and roles."""
    if not texts:
        raise ValueError("analyze needs at least one text")
    items = [text_attention(encoder, t) for t in (progress(texts) if progress else texts)]
    metrics = corpus_metrics((x.attn, x.tokens) for x in items)
    if probe:
        metrics["duplicate"], metrics["induction"] = copy_probe(encoder)
    return Analysis(items, {k: v.float() for k, v in metrics.items()}, head_roles(metrics))
