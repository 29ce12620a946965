"""The fused backend: torch.nn.functional.scaled_dot_product_attention.

Torch's kernels differ by version and device in what a query row with no allowed key returns
(NaN in several). We make such rows attend everywhere inside the kernel (finite, no NaN in the
backward either) and zero their output afterwards, with tensor ops only (no sync, compile-safe).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..call import AttentionCall
from .allowed import allowed_mask


def sdpa_why_not(call: AttentionCall) -> list[str]:
    reasons = []
    if call.return_weights:
        reasons.append("it cannot return attention weights (the eager backend can)")
    if call.q.shape[2] == 0 or call.k.shape[2] == 0:
        tq, tk = call.q.shape[2], call.k.shape[2]
        reasons.append(f"empty sequence (Tq={tq}, Tk={tk}): torch's kernels do not take it")
    return reasons


def sdpa_attention(call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    q, k, v = call.q, call.k, call.v
    tq, tk = q.shape[2], k.shape[2]
    # Top-left and bottom-right causality coincide when Tq == Tk: let the kernel do it.
    native_causal = call.causal and tq == tk and call.mask is None and call.bias is None
    allowed = None if native_causal else allowed_mask(call)
    row_ok: Tensor | None = None  # (..., Tq, 1): False where a query may attend to nothing

    attn_mask: Tensor | None = None
    if allowed is not None:
        row_ok = allowed.any(dim=-1, keepdim=True)
        attn_mask = allowed | ~row_ok  # dead rows attend everywhere; their output is zeroed below
    if call.bias is not None:
        bias = call.bias.to(q.dtype)
        bias_ok = (bias > float("-inf")).any(dim=-1, keepdim=True)
        bias = bias.masked_fill(~bias_ok, 0.0)
        row_ok = bias_ok if row_ok is None else row_ok & bias_ok
        if attn_mask is not None:
            bias = bias.masked_fill(~attn_mask, torch.finfo(q.dtype).min)
        attn_mask = bias

    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=attn_mask,
        dropout_p=call.dropout_p,
        is_causal=native_causal,
        scale=call.scale,
        enable_gqa=call.groups > 1,
    )
    if row_ok is not None:
        out = out.masked_fill(~row_ok, 0.0)
    return out, None
