"""capture(model): record every attention call's per-head q, k, v and weights.

    with capture(model) as records:
        model(...)
    records[0].name, records[0].weights  # (B, H, Tq, Tk)

The model's own computation is untouched (same backend, same outputs, bit for bit); the
weights are computed beside it with the eager backend, only while capturing. They are the
attention probabilities before dropout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..functional.attention import INTERCEPTORS
from ..functional.backends import get_backend
from .scope import tracked_names


@dataclass(frozen=True)
class AttentionRecord:
    """One attention call. Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv),
    weights (B, H, Tq, Tk). All detached."""

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
    """Record every multihead attention call made inside the block (by `model` or anything else).

    `model` names the records after its attention modules ("layers.3.attn"); calls from
    elsewhere are named "attention". `keep_qkv=False` keeps only the weights (less memory).
    """
    records = Records()
    eager = get_backend("eager")

    with tracked_names(model) as names:

        def observe(call, backend, run):
            out, weights = run(call, backend)
            if weights is None or call.dropout_p > 0:
                weights = eager.run(call._replace(return_weights=True, dropout_p=0.0))[1]
            empty = call.q.new_empty(0)
            records.append(
                AttentionRecord(
                    names.current,
                    call.q.detach() if keep_qkv else empty,
                    call.k.detach() if keep_qkv else empty,
                    call.v.detach() if keep_qkv else empty,
                    weights.detach(),
                )
            )
            return out, (weights if call.return_weights else None)

        INTERCEPTORS.append(observe)
        try:
            yield records
        finally:
            INTERCEPTORS.remove(observe)
