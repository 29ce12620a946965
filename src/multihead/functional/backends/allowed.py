"""Combine the boolean mask with bottom-right causality into one 'may attend' mask."""

from __future__ import annotations

from torch import Tensor

from .. import masks
from ..call import AttentionCall


def allowed_mask(call: AttentionCall) -> Tensor | None:
    """Boolean mask broadcastable to (B, H, Tq, Tk), True = may attend; None when all may."""
    if not call.causal:
        return call.mask
    tq, tk = call.q.shape[2], call.k.shape[2]
    causal = masks.causal(tq, tk, align="bottom_right", device=call.q.device)  # (Tq, Tk)
    return causal if call.mask is None else call.mask & causal
