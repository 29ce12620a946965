"""Combine the boolean mask with bottom-right causality into one 'may attend' mask.

Shapes: masks are 4-D, broadcastable to (B, H, Tq, Tk); a causal block is (Tq, Tk).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..call import AttentionCall, dense_call


def causal_block(q_start: int, q_stop: int, tq: int, tk: int, device) -> Tensor:
    """(q_stop - q_start, tk) rows of the bottom-right causal mask of a (tq, tk) call: query i
    sees keys 0 .. i + tk - tq."""
    ones = torch.ones(q_stop - q_start, tk, dtype=torch.bool, device=device)
    return ones.tril(q_start + tk - tq)  # row r (query q_start + r) keeps keys <= that diagonal


def allowed_mask(call: AttentionCall) -> Tensor | None:
    """Boolean mask broadcastable to (B, H, Tq, Tk), True = may attend; None when all may."""
    call = dense_call(call)  # a window, documents or a prefix, as a dense mask (if any)
    tq, tk = call.q.shape[2], call.k.shape[2]
    if not call.causal or (tq == 1 and tk >= 1):
        return call.mask  # one query aligned bottom-right sees every key: nothing to mask
    causal = causal_block(0, tq, tq, tk, call.q.device)  # (Tq, Tk)
    return causal if call.mask is None else call.mask & causal
