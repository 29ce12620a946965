"""A mask inside a causal band (`functional.mask_band.BandMask`: a causal window within
documents, a window with holes, any mask_mod whose pairs lie within L keys before their
query) as batched kernel calls over overlapping bands, each block under its own mask.

As tile_band.py runs a causal window: query blocks of b rows are the kernel's batch, block
i (rows q0 .. q0 + b - 1) over keys q0 - L .. q0 + b - 1 (overlapping views of k and v), but
where the window's band has one (b, L + b) mask for every block, here each block's mask is
gathered from the band's `allowed` (so a block that crosses a document boundary blocks the
keys of the document before). The backward is the band transposed (key blocks of b, each
with the L + b queries that may see it; only dq is added where the blocks overlap). The rows
before the first whole band (which would reach before key 0), the rows after the last whole
block, and in the backward the last keys (whose queries would run past T) each run as one
small masked call. Each call computes (L + b) keys a row, of which the band allows at most
L + 1: a causal window of 64 within documents, with b = 32, 1.5x its pairs, in a handful of
calls, against the general plan's tiles of 128 (~4x the pairs, a call per tile).

A row with no allowed key gets the kernel's out = 0 and lse = 0, and gradients 0.

The masks (float, in the inputs' dtype) are made once per plan and dtype: a held plan's
band lives on the plan, so its calls reuse them; a call's own band lives with the call.

Shapes: q (B, H, T, D), k / v (B, Hkv, T, D); allowed (B or 1, H or 1, T, L + 1); the
forward's block masks (B or 1, n, H or 1, b, L + b), the backward's (B or 1, n, H or 1, L + b,
b); out (B, H, T, Dv), lse (B, H, T).
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

from ..mask_band import BandMask
from .tile_band import overlap_add
from .tile_intervals import Intervals, band_intervals
from .tile_kernel import KERNEL_DTYPES, NEG_INF, flash_backward, flash_forward

FORWARD_BLOCK = 32  # rows per forward block (the kernel runs 32-row query tiles)
MAX_BAND_BLOCKS = 6  # the backward's band, at most this many blocks (its dq is a band a block)
CHUNK_ELEMENTS = 2**19  # query-gradient elements per backward call (2 MB in fp32)
MASK_ELEMENTS = 2**24  # the masks of a plan, at most (64 MB in fp32)


def backward_block(left: int) -> int:
    """Keys per backward block: 64 where the band reaches that far back, else 32; doubled
    while a band would hold more than MAX_BAND_BLOCKS blocks."""
    b = 32
    while b * 2 <= min(left, 64):
        b *= 2
    while left + b > MAX_BAND_BLOCKS * b:
        b *= 2
    return b


class MaskedBand:
    """A band's plan for one sequence length: its blocks, and its masks made on first use
    per dtype (kept here, for every call the plan serves)."""

    def __init__(self, band: BandMask, T: int):
        self.band, self.T = band, T
        self.left = L = band.left
        self.fb = FORWARD_BLOCK
        self.first, self.stop = -(-L // self.fb), T // self.fb  # forward blocks run batched
        self.bb = backward_block(L)
        self.keys = (T - (L + self.bb)) // self.bb + 1  # backward key blocks run batched
        self._masks: dict[tuple[str, torch.dtype], Tensor] = {}
        self._intervals: list[Intervals | None] = []  # (found once: `intervals`)
        self._lock = threading.Lock()

    def intervals(self) -> Intervals | None:
        """The band's rows as key intervals (`tile_intervals.band_intervals`: the interval
        kernel runs the plan instead of the blocks), found once; None where a row has a hole."""
        with self._lock:
            if self._intervals:
                return self._intervals[0]
        found = band_intervals(self.band)
        with self._lock:
            self._intervals[:] = [found]
        return found

    def fits(self) -> bool:
        """Whether both directions have at least two batched blocks and the masks fit."""
        b, h = self.band.allowed.shape[:2]
        size = b * h * self.T * (self.left + max(self.fb, self.bb)) * 2
        return self.stop - self.first >= 2 and self.keys >= 2 and size <= MASK_ELEMENTS

    def mask(self, which: str, dtype: torch.dtype) -> Tensor:
        """The forward's ("forward") or backward's ("backward") block masks, additive."""
        key = (which, dtype)
        with self._lock:
            found = self._masks.get(key)
        if found is None:
            allowed = self._forward() if which == "forward" else self._backward()
            found = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, NEG_INF)
            with self._lock:
                self._masks[key] = found
        return found

    def _forward(self) -> Tensor:
        """(B or 1, n, H or 1, b, L + b): block i's row r (position (first + i) b + r), column
        c (key position (first + i) b - L + c), band column c - r."""
        L, b, allowed = self.left, self.fb, self.band.allowed
        rows = allowed[:, :, self.first * b : self.stop * b].unflatten(2, (-1, b))
        e = torch.arange(L + b)[None, :] - torch.arange(b)[:, None]  # (b, L + b)
        return _gather(rows, e, L).transpose(1, 2).contiguous()

    def _backward(self) -> Tensor:
        """(B or 1, n, H or 1, L + b, b): key block j's query row r (position j b + r),
        column c (key position j b + c), band column c - r + L."""
        L, b, allowed = self.left, self.bb, self.band.allowed
        span = allowed[:, :, : (self.keys - 1) * b + L + b]
        rows = span.unfold(2, L + b, b).transpose(3, 4)  # (B, H, n, L + b, L + 1)
        e = torch.arange(b)[None, :] - torch.arange(L + b)[:, None] + L  # (L + b, b)
        return _gather(rows, e, L).transpose(1, 2).contiguous()

    def dense(self, r0: int, r1: int, k0: int, k1: int, like: Tensor) -> Tensor:
        """The additive mask (B or 1, H or 1, r1 - r0, k1 - k0) of queries r0 .. r1 - 1 over
        keys k0 .. k1 - 1, in like's dtype."""
        L = self.left
        e = torch.arange(k0, k1)[None, :] - torch.arange(r0, r1)[:, None] + L
        allowed = _gather(self.band.allowed[:, :, r0:r1], e, L)
        return torch.zeros(allowed.shape, dtype=like.dtype).masked_fill_(~allowed, NEG_INF)


def _gather(rows: Tensor, e: Tensor, L: int) -> Tensor:
    """rows (.., r, L + 1) at band columns e (r, c), False where e is outside 0 .. L."""
    inside = (e >= 0) & (e <= L)
    index = e.clamp(0, L).expand(*rows.shape[:-1], e.shape[-1])
    return rows.gather(-1, index) & inside


def masked_band_plan(band: BandMask | None, mask, bias, q: Tensor, k: Tensor) -> MaskedBand | None:
    """The plan of a call this path serves: a band, no mask or bias, square, on the fused
    kernel's dtypes, long enough for batched blocks; else None."""
    if band is None or mask is not None or bias is not None:
        return None
    T = q.shape[2]
    if k.shape[2] != T or q.dtype not in KERNEL_DTYPES or band.allowed.shape[2] != T:
        return None
    plan = MaskedBand(band, T)
    return plan if plan.fits() else None


def _part(mask: Tensor, rows: slice, heads: slice, batch_dim: int, head_dim: int) -> Tensor:
    """A unit's batch rows and heads of a mask (those dims of size 1 stay)."""
    if mask.shape[batch_dim] != 1:
        mask = mask.narrow(batch_dim, rows.start or 0, _len(rows, mask.shape[batch_dim]))
    if mask.shape[head_dim] != 1:
        mask = mask.narrow(head_dim, heads.start or 0, _len(heads, mask.shape[head_dim]))
    return mask


def _len(s: slice, size: int) -> int:
    start, stop, _ = s.indices(size)
    return stop - start


def masked_band_forward(q, k, v, plan: MaskedBand, scale, out, lse, rows: slice, heads: slice):
    """Write out (B, H, T, Dv) and lse (B, H, T) of a unit: batch rows `rows` and query heads
    `heads` of the call (q, k, v, out, lse are the unit's slices already)."""
    B, H, T, _ = q.shape
    L, b = plan.left, plan.fb
    n = plan.stop - plan.first
    r = slice(plan.first * b, plan.stop * b)
    masks = _part(plan.mask("forward", q.dtype), rows, heads, 0, 2)
    for i in range(B):  # (blocks are the kernel's batch; batch elements one call each)
        blocks = q[i, :, r].unflatten(1, (n, b)).transpose(0, 1)  # (n, H, b, D)
        kb, vb = (x[i, :, r.start - L : r.stop].unfold(1, L + b, b).permute(1, 0, 3, 2)
                  for x in (k, v))  # fmt: skip
        o, l = flash_forward(blocks, kb, vb, attn_mask=masks[min(i, masks.shape[0] - 1)],
                             scale=scale)  # fmt: skip
        out[i, :, r] = o.transpose(0, 1).reshape(H, n * b, -1)
        lse[i, :, r] = l.transpose(0, 1).reshape(H, n * b)
    for r0, r1, k0 in ((0, r.start, 0), (r.stop, T, r.stop - L)):
        if r0 < r1:
            mask = _part(plan.dense(r0, r1, k0, r1, q), rows, heads, 0, 1)
            o, l = flash_forward(q[:, :, r0:r1], k[:, :, k0:r1], v[:, :, k0:r1],
                                 attn_mask=mask, scale=scale)  # fmt: skip
            out[:, :, r0:r1], lse[:, :, r0:r1] = o, l


def masked_band_backward(
    q, k, v, grad_out, out, lse, plan: MaskedBand, scale, dq, dk, dv, rows: slice, heads: slice
):
    """Write all of a unit's dq (B, H, T, D), dk, dv (B, Hkv, T, D) from the global out and
    lse: the last keys (whose queries would run past T) in one masked call, then the key
    blocks as bands, a few blocks a call, last to first (so each overlap-add lands on
    positions already written)."""
    B, H, T, D = q.shape
    L, b = plan.left, plan.bb
    width = L + b
    n = plan.keys
    t0 = n * b
    out, lse = out.to(q.dtype), lse.to(q.dtype)
    s = (slice(None), slice(None), slice(t0, T))
    mask = _part(plan.dense(t0, T, t0, T, q), rows, heads, 0, 1)
    dq[s], dk[s], dv[s] = flash_backward(
        grad_out[s], q[s], k[s], v[s], out[s], lse[s], 0.0, False, attn_mask=mask, scale=scale
    )
    masks = _part(plan.mask("backward", q.dtype), rows, heads, 0, 2)
    per_call = max(1, CHUNK_ELEMENTS // (H * width * D))
    for i in range(B):
        m = masks[min(i, masks.shape[0] - 1)]
        span = (slice(None), slice(0, (n - 1) * b + width))
        bands = [_query_band(x[i][span], width, b) for x in (grad_out, q, out, lse)]
        keys = [x[i, :, :t0].unflatten(1, (n, b)).transpose(0, 1) for x in (k, v)]
        for j0 in reversed(range(0, n, per_call)):
            j1 = min(n, j0 + per_call)
            c = slice(j0, j1)
            dq_t, dk_t, dv_t = flash_backward(
                *(x[c] for x in bands[:2]), *(x[c] for x in keys), *(x[c] for x in bands[2:]),
                0.0, False, attn_mask=m[c], scale=scale,
            )  # fmt: skip
            overlap_add(dq[i], dq_t, j0 * b, b, width)  # dq_t (blocks, H, L + b, D)
            for grad, g in ((dk, dk_t), (dv, dv_t)):  # (blocks, Hkv, b, D)
                grad[i, :, j0 * b : j1 * b] = g.transpose(0, 1).flatten(1, 2)


def _query_band(x: Tensor, width: int, b: int) -> Tensor:
    """(H, span, ..) -> (n, H, width, ..): each key block's queries, overlapping views."""
    u = x.unfold(1, width, b)
    if x.dim() == 3:
        return u.permute(1, 0, 3, 2)  # (H, n, D, width) ->
    return u.transpose(0, 1)  # (H, n, width) ->
