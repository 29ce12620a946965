"""capture(model): record every attention call's per-head q, k, v and weights.

    with capture(model) as records:
        model(...)
    records[0].name, records[0].weights  # (B, H, Tq, Tk)

The model's own computation is untouched (same backend, same outputs, bit for bit); the
weights are computed beside it with the eager backend, only while capturing and only in the
context (thread) that opened the capture. They are the attention probabilities before dropout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..functional.call import AttentionCall
from ..hook_points import HookSession
from ..hooked.hooks import eager_only


@dataclass(frozen=True)
class AttentionRecord:
    """One attention call. Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv),
    weights (B, H, Tq, Tk). All detached. q and k are as attended: after RoPE, and k/v hold
    every key the call saw (with a KV cache, the cached ones too)."""

    name: str
    q: Tensor
    k: Tensor
    v: Tensor
    weights: Tensor


class Records(list):
    """The records of a capture session, in call order."""

    def names(self) -> list[str]:
        return [r.name for r in self]

    def weights(self) -> Tensor:
        """All weights stacked: (calls, B, H, Tq, Tk); the calls must share one shape."""
        shapes = {tuple(r.weights.shape) for r in self}
        if len(shapes) != 1:
            raise ValueError(f"records have different weight shapes {sorted(shapes)}; index them")
        return torch.stack([r.weights for r in self])


@contextmanager
def capture(model: nn.Module | None = None, *, keep_qkv: bool = True) -> Iterator[Records]:
    """Record the attention calls made inside the block by `model`'s attention modules (or,
    with no model, by any multihead attention module or `functional.attention` call).

    Records are named after the modules ("layers.3.attn"; "attention" without a model).
    `keep_qkv=False` keeps only the weights (less memory). Only this thread's (context's)
    calls are recorded.
    """
    records = Records()
    names: dict[int, str] = {}
    if model is not None:
        model = eager_only(model, "capture()")
        names = {id(m): n or "attention" for n, m in model.named_modules()}

    def observe(prefix: str, call: AttentionCall, weights: Tensor) -> None:
        empty = call.q.new_empty(0)
        records.append(
            AttentionRecord(
                prefix,
                call.q.detach() if keep_qkv else empty,
                call.k.detach() if keep_qkv else empty,
                call.v.detach() if keep_qkv else empty,
                weights.detach(),
            )
        )

    session = HookSession(model, observer=observe, observer_names=names)
    with session.active():
        yield records
