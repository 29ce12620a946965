"""One tile of the tiled backend on torch's fused CPU flash kernel: forward with its
log-sum-exp, backward from the GLOBAL log-sum-exp and output (so each tile yields exactly its
share of the gradients, as `functional.tiles.tile_backward` does in plain torch).

The kernel gives a row with no allowed key out = 0 and lse = 0; merging needs lse = -inf there,
so partial tiles set it from the mask. A full tile passes no mask at all.

Also what the fast paths (tile_band, tile_segments, tile_prefix) share: the test that a call
has one kind of structure alone, and a "run" (a square run of rows, causal or not, that also
sees every key of a stretch before it), which the document and prefix paths are made of.

Shapes: q (B, H, tq, D), k (B, Hkv, tk, D), v (B, Hkv, tk, Dv) (the kernel reads grouped heads
itself); allowed / bias broadcastable to (B, H, tq, tk); out (B, H, tq, Dv), lse (B, H, tq).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tiles import merge_into

NEG_INF = float("-inf")
KERNEL_DTYPES = (torch.float32, torch.float64)
STRUCTURE_KINDS = ("window", "documents", "prefix", "mask_mod")
flash_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def kernel_runs(q: Tensor, v: Tensor) -> bool:
    """Whether the fused CPU kernel serves this call's tiles (else plain torch tiles do): CPU,
    fp32 / fp64, and values as wide as queries (the kernel refuses other value widths)."""
    return q.device.type == "cpu" and q.dtype in KERNEL_DTYPES and v.shape[-1] == q.shape[-1]


def serves_alone(kind: str, structure, mask, bias, q: Tensor, k: Tensor) -> bool:
    """Whether a call has structure of `kind` and no other (no other kind, mask_mod, mask or
    bias), is square and on the kernel's dtypes: what a fast path serves."""
    if structure is None or getattr(structure, kind) is None:
        return False
    if any(getattr(structure, other) is not None for other in STRUCTURE_KINDS if other != kind):
        return False
    if mask is not None or bias is not None:
        return False
    return q.shape[2] == k.shape[2] and q.dtype in KERNEL_DTYPES


def additive_mask(allowed: Tensor | None, bias: Tensor | None, dtype) -> Tensor | None:
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
    mask = additive_mask(allowed, bias, q.dtype)
    out, lse = flash_forward(q, k, v, is_causal=diagonal, attn_mask=mask, scale=scale)
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
    mask = additive_mask(allowed, bias, q.dtype)
    safe = torch.where(lse == NEG_INF, 0.0, lse)  # rows with no key anywhere: all scores -inf
    return flash_backward(
        grad_out, q, k, v, out, safe.to(lse.dtype), 0.0, diagonal, attn_mask=mask, scale=scale
    )


def run_forward(q, k, v, r0: int, r1: int, start: int, causal: bool, scale: float):
    """(out, lse) of query rows r0..r1 over keys r0..r1 (causal or not) and every key
    start..r0 before them (none when start == r0): one kernel call each, merged by log-sum-exp.
    q (B, H, T, D), k / v (B, Hkv, T, D) -> out (B, H, r1 - r0, Dv), lse (B, H, r1 - r0)."""
    rows = slice(r0, r1)
    o, l = flash_forward(q[:, :, rows], k[:, :, rows], v[:, :, rows], is_causal=causal, scale=scale)
    if start < r0:  # every pair with the keys before the run is allowed
        before = slice(start, r0)
        o, l = o.contiguous(), l.contiguous()
        o2, l2 = flash_forward(q[:, :, rows], k[:, :, before], v[:, :, before], scale=scale)
        merge_into(o, l, o2, l2)
    return o, l


def run_backward(q, k, v, grad_out, out, lse, r0, r1, start, causal, scale, dq, dk, dv) -> None:
    """The gradients of a `run_forward` run from the global out and lse: dq, dk, dv of
    positions r0..r1 written, dk, dv of keys start..r0 added to (so those must hold their own
    gradients already: runs go in order of position)."""
    rows = (slice(None), slice(None), slice(r0, r1))
    g, o, l = grad_out[rows], out[rows], lse[rows].to(q.dtype)
    dq[rows], dk[rows], dv[rows] = flash_backward(
        g, q[rows], k[rows], v[rows], o, l, 0.0, causal, scale=scale
    )
    if start < r0:
        before = (slice(None), slice(None), slice(start, r0))
        dq_t, dk_t, dv_t = flash_backward(
            g, q[rows], k[before], v[before], o, l, 0.0, False, scale=scale
        )
        dq[rows] += dq_t
        dk[before] += dk_t
        dv[before] += dv_t
