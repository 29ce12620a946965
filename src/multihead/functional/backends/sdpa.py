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
    q, k, v, mask, bias, causal, scale, dropout_p, _ = call
    gqa = q.shape[1] != k.shape[1]
    if mask is None and bias is None and (not causal or q.shape[2] == k.shape[2]):
        # No row can be empty, and top-left/bottom-right causality coincide: the kernel does all.
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale, enable_gqa=gqa
        )
        return out, None

    allowed = allowed_mask(call)
    row_ok: Tensor | None = None  # (..., Tq, 1): False where a query may attend to nothing
    attn_mask: Tensor | None = None
    if allowed is not None:
        row_ok = allowed.any(dim=-1, keepdim=True)
        attn_mask = allowed | ~row_ok  # dead rows attend everywhere; their output is zeroed below
    if bias is not None:
        bias = bias.to(q.dtype)
        bias_ok = (bias > float("-inf")).any(dim=-1, keepdim=True)
        bias = bias.masked_fill(~bias_ok, 0.0)
        row_ok = bias_ok if row_ok is None else row_ok & bias_ok
        if attn_mask is not None:
            bias = bias.masked_fill(~attn_mask, torch.finfo(q.dtype).min)
        attn_mask = bias

    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=gqa
    )
    if row_ok is not None:
        # torch.where keeps the kernel's (B, T, H, D) memory layout, so the caller's
        # (B, H, T, D) -> (B, T, H*D) reshape stays free; masked_fill would densify it (2 copies).
        out = torch.where(row_ok, out, 0.0)
    return out, None
