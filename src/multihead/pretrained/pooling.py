"""Sentence-transformers' pooling of token states into one vector per text: "mean" over real
tokens, "cls" (the first token), "max" (per feature over real tokens); several modes are
concatenated in the order given (sentence-transformers': cls, max, mean).

Shapes: padded hidden (B, T, C) with mask (B, T) -> (B, k C); packed hidden (N, C) -> (n, k C),
k = number of modes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional.varlen import VarLen

POOLING_MODES = ("cls", "max", "mean")


def pool_padded(hidden: Tensor, attention_mask: Tensor, modes: tuple[str, ...]) -> Tensor:
    """(B, T, C), (B, T) of 1 = token -> (B, k C)."""
    real = attention_mask.bool()[..., None]  # (B, T, 1)
    out = []
    for mode in modes:
        if mode == "mean":
            m = real.to(hidden.dtype)
            out.append((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9))
        elif mode == "cls":
            first = real[..., 0].int().argmax(1)  # (B,): the first real token (left padding too)
            out.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), first])
        else:  # max
            out.append(hidden.masked_fill(~real, float("-inf")).amax(1))
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)


def pool_packed(hidden: Tensor, packed: VarLen, modes: tuple[str, ...]) -> Tensor:
    """(N, C) packed sequences -> (n, k C); each run of equal lengths is one (n, L, C) view."""
    out = []
    for mode in modes:
        if mode == "mean":
            out.append(packed.mean(hidden))
            continue
        parts = []
        for start, n, length in packed.runs:
            run = hidden[start : start + n * length].unflatten(0, (n, length))  # (n, L, C)
            parts.append(run[:, 0] if mode == "cls" else run.amax(1))
        out.append(torch.cat(parts) if parts else hidden.new_empty(0, hidden.shape[-1]))
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)
