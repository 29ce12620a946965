"""Causal sliding windows as one batched kernel call instead of a loop over tiles.

With a causal window of W keys (query p sees keys p - L .. p, L = W - 1) and query blocks of
b rows, block i (rows q0 = i b .. q0 + b - 1; row r at position q0 + r) sees keys
q0 - L .. q0 + b - 1 (L + b of them), row r the columns c with r <= c <= r + L: the same band
for every block, so one (b, L + b) mask serves them all. One call of torch's fused CPU kernel
runs every block at once (the blocks become the kernel's heads; their keys are overlapping
views of k and v, `Tensor.unfold`), and its backward gives each block's key gradients, added
back where the views overlap. Each row computes (L + b) / W times its pairs.

Why one masked band and not the exact split (an edge triangle, a full middle, a diagonal
triangle, merged by log-sum-exp; the general tile plan does that per block): torch's kernel
is slow on small causal tiles (measured, fwd + bwd per pair, 1 thread: a 128 x 128 causal
tile 34 ns, 128 x 384 without causality 11 ns, a 4096-long causal call 8 ns), so the band's
(L + b) / W = 1.25x pairs at W = 256 (b = 64) cost less than the exact pairs in small tiles.

Blocks whose band would reach before key 0, and a last block shorter than b, are left to the
general tile plan (`tiled.py` runs them; `BandPlan.first` / `stop` say which blocks are here).

Shapes: q (B, H, T, D), k / v (B, Hkv, T, D / Dv); out (B, H, T, Dv), lse (B, H, T); the
kernel layout (B * H, n, rows, D) with n = stop - first blocks; the mask (1, 1, b, L + b).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .tile_kernel import additive_mask, flash_backward, flash_forward, serves_alone

# The band's key gradients come back as one (n, L + b, D) tensor per head: (L + b) / b copies
# of k. Wide windows get larger blocks to keep that to a few copies.
MAX_BAND_BLOCKS = 6
CHUNK_ELEMENTS = 2**19  # key-gradient elements per backward call (2 MB in fp32)


class BandPlan(NamedTuple):
    block: int  # b: rows per block
    left: int  # L: keys before the query's own
    first: int  # first block run here (earlier blocks' bands reach before key 0)
    stop: int  # one past the last block run here (a shorter last block is not)

    @property
    def rows(self) -> slice:
        return slice(self.first * self.block, self.stop * self.block)

    @property
    def width(self) -> int:
        return self.left + self.block


def band_block(left: int) -> int:
    """b: 128 rows where the window is at least that wide (the kernel's rate drops on smaller
    tiles), a power of two between 32 and L for narrower ones, larger for wide windows."""
    b = 32
    while b * 2 <= min(left, 64):
        b *= 2
    while (left + b) > MAX_BAND_BLOCKS * b:
        b *= 2
    return b


def band_plan(structure, causal: bool, mask, bias, q: Tensor, k: Tensor) -> BandPlan | None:
    """The plan of a call this path serves (a causal window alone: no documents, prefix,
    mask_mod, mask or bias; square, on the fused kernel's dtypes), else None."""
    if not causal or not serves_alone("window", structure, mask, bias, q, k):
        return None
    left = structure.window[0]  # (causality cuts the window's right side)
    if left < 1:
        return None
    b = band_block(left)
    first, stop = -(-left // b), q.shape[2] // b
    if stop - first < 2:
        return None  # too short to pay for a batched call
    return BandPlan(b, left, first, stop)


def _band_mask(plan: BandPlan, dtype, device) -> Tensor:
    """(1, 1, b, L + b) additive mask: row r sees columns r .. r + L."""
    r = torch.arange(plan.block, device=device)[:, None]
    c = torch.arange(plan.width, device=device)[None, :]
    mask = additive_mask((c >= r) & (c <= r + plan.left), None, dtype)
    assert mask is not None
    return mask[None, None]


def _blocks(x: Tensor, plan: BandPlan) -> Tensor:
    """Rows of the planned blocks: (B, H, T, D) -> (B * H, n, b, D)."""
    B, H, _, D = x.shape
    return x[:, :, plan.rows].reshape(B * H, plan.stop - plan.first, plan.block, D)


def _band(x: Tensor, plan: BandPlan, heads: int) -> Tensor:
    """Each planned block's keys q0 - L .. q0 + b - 1: (B, Hkv, T, D) -> (B * heads, n, L + b,
    D), overlapping views of x (kv heads repeated for grouped-query heads: a copy)."""
    B, _, _, D = x.shape
    s0 = plan.first * plan.block - plan.left
    span = x[:, :, s0 : plan.stop * plan.block]
    views = span.unfold(2, plan.width, plan.block).transpose(-1, -2)  # (B, Hkv, n, L + b, D)
    if views.shape[1] != heads:
        views = views.repeat_interleave(heads // views.shape[1], dim=1)
    return views.reshape(B * heads, plan.stop - plan.first, plan.width, D)


def band_forward(q, k, v, plan: BandPlan, scale: float, out: Tensor, lse: Tensor) -> None:
    """Write the planned blocks' rows of out (B, H, T, Dv) and lse (B, H, T)."""
    B, H, _, _ = q.shape
    n, b = plan.stop - plan.first, plan.block
    o, l = flash_forward(
        _blocks(q, plan), _band(k, plan, H), _band(v, plan, H),
        attn_mask=_band_mask(plan, q.dtype, q.device), scale=scale,
    )  # fmt: skip
    out[:, :, plan.rows] = o.reshape(B, H, n * b, -1)
    lse[:, :, plan.rows] = l.reshape(B, H, n * b)


def _add_band(grad: Tensor, band: Tensor, plan: BandPlan) -> None:
    """Per-block key gradients band (B, Hkv, n, L + b, D) into grad (B, Hkv, T, D) at keys
    q0 - L + c: each block's first b keys written (they tile the range once), the rest added
    (consecutive blocks' bands overlap there)."""
    b, n = plan.block, plan.stop - plan.first
    s0 = plan.first * b - plan.left
    st = grad.stride()
    for j in range(0, plan.width, b):  # chunk j of every band lands on one stride-b view
        w = min(b, plan.width - j)
        # keys s0 + j + i b + c (block i, c < w <= b): views that do not overlap each other
        dst = grad.as_strided(
            (grad.shape[0], grad.shape[1], n, w, grad.shape[3]),
            (st[0], st[1], b * st[2], st[2], st[3]),
            grad.storage_offset() + (s0 + j) * st[2],
        )
        if j == 0:
            dst.copy_(band[:, :, :, :w])
        else:
            dst += band[:, :, :, j : j + w]


def band_zero_unwritten(dq: Tensor, dk: Tensor, dv: Tensor, plan: BandPlan) -> None:
    """Zero what `band_backward` does not write first in dq (B, H, T, D), dk, dv (B, Hkv, T,
    D) (the general plan's rows of dq; the keys before the band's first run and after its
    last one of dk and dv), so that buffers may start uninitialised: most of them are never
    filled twice."""
    dq[:, :, : plan.rows.start].zero_()
    dq[:, :, plan.rows.stop :].zero_()
    for grad in (dk, dv):
        grad[:, :, : plan.first * plan.block - plan.left].zero_()
        grad[:, :, plan.stop * plan.block - plan.left :].zero_()


def band_backward(q, k, v, grad_out, out, lse, plan: BandPlan, scale: float, dq, dk, dv):
    """Write the planned blocks' rows of dq (B, H, T, D) and add their shares of dk, dv
    (B, Hkv, T, D) (see `band_zero_unwritten`), from the global out (B, H, T, Dv) and lse
    (B, H, T), a few blocks per kernel call: the kernel's band-sized key gradients then stay a
    few MB (measured: one call over every block spent a sixth of its time filling fresh
    buffers).

    Each block's first b keys (q0 - L ..) tile the keys q0_first - L .. q0_stop - L once, so
    they are written, not added; the rest of its band is added. Chunks run last to first, so
    a chunk's additions land on keys a later chunk (run before) or itself has written."""
    B, H, _, _ = q.shape
    per_call = max(1, CHUNK_ELEMENTS // (B * H * plan.width * q.shape[3]))
    starts = range(plan.first, plan.stop, per_call)
    mask = _band_mask(plan, q.dtype, q.device)  # (the same band for every chunk)
    for first in reversed(starts):
        chunk = plan._replace(first=first, stop=min(plan.stop, first + per_call))
        _band_backward(q, k, v, grad_out, out, lse, chunk, scale, mask, dq, dk, dv)


def _band_backward(q, k, v, grad_out, out, lse, plan: BandPlan, scale: float, mask, dq, dk, dv):
    B, H, _, _ = q.shape
    Hkv = k.shape[1]
    n, b = plan.stop - plan.first, plan.block
    dq_t, dk_t, dv_t = flash_backward(
        _blocks(grad_out, plan), _blocks(q, plan), _band(k, plan, H), _band(v, plan, H),
        _blocks(out.to(q.dtype), plan), lse[:, :, plan.rows].reshape(B * H, n, b), 0.0, False,
        attn_mask=mask, scale=scale,
    )  # fmt: skip
    dq[:, :, plan.rows] = dq_t.reshape(B, H, n * b, -1)
    for grad, g in ((dk, dk_t), (dv, dv_t)):
        g = g.view(B, Hkv, H // Hkv, n, plan.width, -1)
        _add_band(grad, g.sum(dim=2) if H != Hkv else g[:, :, 0], plan)
