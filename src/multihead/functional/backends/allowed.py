"""Combine the boolean mask with bottom-right causality into one 'may attend' mask."""

from __future__ import annotations

from torch import Tensor

from .. import masks
from ..call import AttentionCall


def allowed_mask(call: AttentionCall) -> Tensor | None:
    """Boolean mask broadcastable to (B, H, Tq, Tk), True = may attend; None when all may."""
    tq, tk = call.q.shape[2], call.k.shape[2]
    if not call.causal or (tq == 1 and tk >= 1):
        return call.mask  # one query aligned bottom-right sees every key: nothing to mask
    causal = masks.causal(tq, tk, align="bottom_right", device=call.q.device)  # (Tq, Tk)
    return causal if call.mask is None else call.mask & causal
