"""A prefix-LM call (one int prefix P, causal, nothing else) as three large kernel calls instead
of a plan of tiles.

Queries before P see exactly the keys before P (both ways); queries from P on see every key up
to their own (plain causality). So:

    rows :P   x keys :P    one call without causality
    rows P:   x keys P:    one causal call (square: the kernel's top-left causality is right)
    rows P:   x keys :P    one call without causality, merged into the rows above by log-sum-exp

Every pair computed is allowed, and each call is long enough for torch's kernel to run at its
large-call rate (small causal tiles cost it up to 4x per pair). The backward pass runs the three
kernel backwards from the global out and lse; the keys before P gather gradients from two.

Shapes: q (B, H, T, D), k / v (B, Hkv, T, D / Dv) (the kernel reads grouped heads itself);
out (B, H, T, Dv), lse (B, H, T).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tiles import merge_into
from .tile_kernel import KERNEL_DTYPES

_forward_kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_backward_kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def prefix_plan(structure, causal: bool, mask, bias, q: Tensor, k: Tensor) -> int | None:
    """P, when a call is causal with an int prefix and nothing else (no window, documents,
    mask_mod, mask or bias), square, on the kernel's dtypes; else None."""
    if structure is None or not causal or not isinstance(structure.prefix, int):
        return None
    if structure.window is not None or structure.documents is not None:
        return None
    if structure.mask_mod is not None or mask is not None or bias is not None:
        return None
    if q.shape[2] != k.shape[2] or q.dtype not in KERNEL_DTYPES:
        return None
    return structure.prefix


def prefix_forward(q, k, v, prefix: int, scale: float, out: Tensor, lse: Tensor) -> None:
    """Write every row of out (B, H, T, Dv) and lse (B, H, T)."""
    T, P = q.shape[2], prefix
    head, tail = slice(0, P), slice(P, T)
    if P > 0:
        o, l = _forward_kernel(q[:, :, head], k[:, :, head], v[:, :, head], scale=scale)
        out[:, :, head], lse[:, :, head] = o, l
    if P < T:
        o, l = _forward_kernel(
            q[:, :, tail], k[:, :, tail], v[:, :, tail], is_causal=True, scale=scale
        )
        if P > 0:
            o, l = o.contiguous(), l.contiguous()
            o2, l2 = _forward_kernel(q[:, :, tail], k[:, :, head], v[:, :, head], scale=scale)
            merge_into(o, l, o2, l2)
        out[:, :, tail], lse[:, :, tail] = o, l


def prefix_backward(q, k, v, grad_out, out, lse, prefix: int, scale: float, dq, dk, dv) -> None:
    """Write dq (B, H, T, D), dk, dv (B, Hkv, T, D) in full (they may start uninitialised)."""
    T, P = q.shape[2], prefix
    head, tail = slice(0, P), slice(P, T)
    out = out.to(q.dtype)
    lse = lse.to(q.dtype)
    if P > 0:
        r = (slice(None), slice(None), head)
        dq[r], dk[r], dv[r] = _backward_kernel(
            grad_out[r], q[r], k[r], v[r], out[r], lse[r], 0.0, False, scale=scale
        )
    if P < T:
        r = (slice(None), slice(None), tail)
        g, o, l = grad_out[r], out[r], lse[r]
        dq[r], dk[r], dv[r] = _backward_kernel(g, q[r], k[r], v[r], o, l, 0.0, True, scale=scale)
        if P > 0:
            h = (slice(None), slice(None), head)
            dq_t, dk_t, dv_t = _backward_kernel(g, q[r], k[h], v[h], o, l, 0.0, False, scale=scale)
            dq[r] += dq_t
            dk[h] += dk_t
            dv[h] += dv_t
