"""One tile of the tiled backend on torch's fused CPU flash kernel: forward with its
log-sum-exp, backward from the GLOBAL log-sum-exp and output (so each tile yields exactly its
share of the gradients, as `functional.tiles.tile_backward` does in plain torch).

The kernel gives a row with no allowed key out = 0 and lse = 0; merging needs lse = -inf there,
so partial tiles set it from the mask. A full tile passes no mask at all.

Shapes: q (B, H, tq, D), k (B, Hkv, tk, D), v (B, Hkv, tk, Dv) (the kernel reads grouped heads
itself); allowed / bias broadcastable to (B, H, tq, tk); out (B, H, tq, Dv), lse (B, H, tq).
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")
KERNEL_DTYPES = (torch.float32, torch.float64)


def kernel_runs(q: Tensor) -> bool:
    """Whether the fused CPU kernel serves this call's tiles (else plain torch tiles do)."""
    return q.device.type == "cpu" and q.dtype in KERNEL_DTYPES


def _additive(allowed: Tensor | None, bias: Tensor | None, dtype) -> Tensor | None:
    """The kernel's float mask: the bias where allowed, -inf where blocked."""
    if bias is None:
        if allowed is None:
            return None
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, NEG_INF
        )
    bias = bias.to(dtype)
    return bias if allowed is None else bias.masked_fill(~allowed, NEG_INF)


def kernel_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None,
    bias: Tensor | None,
    scale: float,
    diagonal: bool = False,
) -> tuple[Tensor, Tensor]:
    """(out, lse) of one tile: softmax over this tile's keys alone; lse = -inf on empty rows.
    `diagonal`: a square tile that the kernel's own (top-left) causality masks."""
    mask = _additive(allowed, bias, q.dtype)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=diagonal, attn_mask=mask, scale=scale
    )
    if mask is not None:
        # (.., tq): rows with a key here that is not blocked (a NaN bias is not a block: the
        # row stays, and its NaN reaches the output)
        alive = (mask != NEG_INF).any(dim=-1)
        lse = torch.where(alive, lse, NEG_INF)
    return out, lse


def kernel_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor,
    out: Tensor,
    lse: Tensor,
    allowed: Tensor | None,
    bias: Tensor | None,
    scale: float,
    diagonal: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of one tile given the global out (B, H, tq, Dv) and lse (B, H, tq)."""
    mask = _additive(allowed, bias, q.dtype)
    safe = torch.where(lse == NEG_INF, 0.0, lse)  # rows with no key anywhere: all scores -inf
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, k, v, out, safe.to(lse.dtype), 0.0, diagonal, attn_mask=mask, scale=scale
    )
