"""Causal sliding windows as one batched kernel call instead of a loop over tiles.

With a causal window of W keys (query p sees keys p - L .. p, L = W - 1) and query blocks of
b rows, block i (rows q0 = i b .. q0 + b - 1; row r at position q0 + r) sees keys
q0 - L .. q0 + b - 1 (L + b of them), row r the columns c with r <= c <= r + L: the same band
for every block, so one (b, L + b) mask serves them all. One call of torch's fused CPU kernel
runs every block at once (the blocks become the kernel's heads; their keys are overlapping
views of k and v, `Tensor.unfold`). Each row computes (L + b) / W times its pairs (the
forward runs blocks of 32 rows, FORWARD_BLOCK: 1.125x at W = 256).

The backward is the same band transposed: key blocks of b, each with the L + b queries that
see it (overlapping views of q, out, grad_out and lse), so each key's gradient comes whole
from one block and only dq is added where the blocks overlap (query blocks with key bands
would overlap-add both dk and dv, each (L + b) / b copies of k).

Why one masked band and not the exact split (an edge triangle, a full middle, a diagonal
triangle, merged by log-sum-exp; the general tile plan does that per block): torch's kernel
is slow on small causal tiles (measured, fwd + bwd per pair, 1 thread: a 128 x 128 causal
tile 34 ns, 128 x 384 without causality 11 ns, a 4096-long causal call 8 ns), so the band's
(L + b) / W = 1.125x-1.25x pairs at W = 256 (b = 32-64) cost less than the exact pairs in
small tiles.

The rows of the blocks before `BandPlan.first` (whose band would reach before key 0) and of a
last block shorter than b (after `BandPlan.stop`) run in one causal and at most two small
masked calls; in the backward, the last keys, whose queries would run past T, in one causal
and one masked call (`_tail_backward`). No pair goes to the general tile plan.

Shapes: q (B, H, T, D), k / v (B, Hkv, T, D / Dv); out (B, H, T, Dv), lse (B, H, T); the
kernel layout (B * H, n, rows, D) with n = stop - first blocks; the mask (1, 1, b, L + b).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .tile_kernel import additive_mask, flash_backward, flash_forward, serves_alone

# The band's keys in the forward (and query gradients in the backward) are one (n, L + b, D)
# tensor per head: (L + b) / b copies of k. Wide windows get larger blocks to keep that to a
# few copies.
MAX_BAND_BLOCKS = 6
# The kernel runs queries in tiles of 32 rows below 192 rows, each tile over all the keys of
# its call: a forward block of 32 computes the fewest masked pairs per row at the same rate
# (measured, forward at T 4096: W 128 24.9 -> 22.3 ms, 256 33 -> 31, 512 58.8 -> 51.2, 1024
# 98.3 -> 85.4 against the plan's 64, 64, 128, 256 rows).
FORWARD_BLOCK = 32
CHUNK_ELEMENTS = 2**19  # query-gradient elements per backward call (2 MB in fp32)


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
    """b: 64 rows where the window reaches that far back (L >= 64), else 32; doubled while
    a band would hold more than MAX_BAND_BLOCKS blocks (wide windows). (Measured at W 256,
    T 4096, fwd + bwd: b 64 2.03x the ideal, 128 2.14x; today 32 / 64 / 128 run 130 / 122 /
    120 ms, 64 and 128 within noise of each other in the module.)"""
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


def _window_mask(rows: int, cols: int, left: int, shift: int, like: Tensor) -> Tensor:
    """(rows, cols) additive mask of the window, in like's dtype and device: query r (at key
    position r + shift) sees key c when c <= r + shift <= c + L, else -inf."""
    r = torch.arange(rows, device=like.device)[:, None] + shift
    c = torch.arange(cols, device=like.device)[None, :]
    mask = additive_mask((c <= r) & (r <= c + left), None, like.dtype)
    assert mask is not None
    return mask


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


def _forward_plan(plan: BandPlan, T: int, grouped: bool) -> BandPlan:
    """The forward's blocks: FORWARD_BLOCK rows where the window is that wide (the backward
    keeps the plan's: there a block's band-sized gradients must stay few copies of q). With
    grouped-query heads the forward's bands are copies, so the plan's block bounds them."""
    b = min(plan.block, FORWARD_BLOCK)
    if grouped and plan.left + b > MAX_BAND_BLOCKS * b:
        return plan
    return plan._replace(block=b, first=-(-plan.left // b), stop=T // b)


def band_forward(q, k, v, plan: BandPlan, scale: float, out: Tensor, lse: Tensor) -> None:
    """Write out (B, H, T, Dv) and lse (B, H, T): the planned blocks in one call, the rows
    before them (whose band would reach before key 0) and after them (a last block shorter
    than b) in `_edge_forward`."""
    B, H, T, _ = q.shape
    plan = _forward_plan(plan, T, grouped=k.shape[1] != H)
    n, b = plan.stop - plan.first, plan.block
    o, l = flash_forward(
        _blocks(q, plan), _band(k, plan, H), _band(v, plan, H),
        # (b, L + b): block row r sits at key column r + L of its band
        attn_mask=_window_mask(plan.block, plan.width, plan.left, plan.left, q)[None, None],
        scale=scale,
    )  # fmt: skip
    out[:, :, plan.rows] = o.reshape(B, H, n * b, -1)
    lse[:, :, plan.rows] = l.reshape(B, H, n * b)
    head = plan.rows.start
    causal = min(head, plan.left + 1)  # the first L + 1 rows see every key before them
    o, l = flash_forward(q[:, :, :causal], k[:, :, :causal], v[:, :, :causal], is_causal=True,
                         scale=scale)  # fmt: skip
    out[:, :, :causal], lse[:, :, :causal] = o, l
    _edge_forward(q, k, v, causal, head, plan, scale, out, lse)
    _edge_forward(q, k, v, plan.rows.stop, T, plan, scale, out, lse)


def _edge_forward(q, k, v, r0: int, r1: int, plan: BandPlan, scale, out, lse) -> None:
    """out, lse of rows r0 .. r1 - 1 (fewer than b) over the keys they see, in one masked
    call (nothing when r0 == r1)."""
    if r0 >= r1:
        return
    k0 = max(0, r0 - plan.left)
    o, l = flash_forward(
        q[:, :, r0:r1], k[:, :, k0:r1], v[:, :, k0:r1],
        attn_mask=_window_mask(r1 - r0, r1 - k0, plan.left, r0 - k0, q), scale=scale,
    )  # fmt: skip
    out[:, :, r0:r1], lse[:, :, r0:r1] = o, l


def _overlap_add(grad: Tensor, band: Tensor, s0: int, plan: BandPlan) -> None:
    """Per-block bands (B, heads, n, L + b, D) into grad (B, heads, T, D) at positions
    s0 + i b + c (block i, column c): each block's first b positions written (they tile
    s0 .. s0 + n b once), the rest added (consecutive blocks' bands overlap there)."""
    b, n = plan.block, band.shape[2]
    st = grad.stride()
    for j in range(0, plan.width, b):  # chunk j of every band lands on one stride-b view
        w = min(b, plan.width - j)
        # positions s0 + j + i b + c (block i, c < w <= b): views that do not overlap
        dst = grad.as_strided(
            (grad.shape[0], grad.shape[1], n, w, grad.shape[3]),
            (st[0], st[1], b * st[2], st[2], st[3]),
            grad.storage_offset() + (s0 + j) * st[2],
        )
        if j == 0:
            dst.copy_(band[:, :, :, :w])
        else:
            dst += band[:, :, :, j : j + w]


def _key_blocks(T: int, plan: BandPlan) -> int:
    """How many key blocks the backward runs as bands: key block j (keys j b .. j b + b - 1)
    is seen by queries j b .. j b + L + b - 1, which must all exist."""
    return (T - plan.width) // plan.block + 1


def _query_band(x: Tensor, n: int, plan: BandPlan) -> Tensor:
    """Each key block's queries j b .. j b + L + b - 1, overlapping views of x: (B, H, T, ..)
    -> (B * H, n, L + b, ..) (no copy)."""
    span = x[:, :, : (n - 1) * plan.block + plan.width].unfold(2, plan.width, plan.block)
    if x.dim() == 4:
        span = span.transpose(-1, -2)  # (B, H, n, L + b, D)
    return span.reshape(x.shape[0] * x.shape[1], n, *span.shape[3:])


def _tail_backward(q, k, v, grad_out, out, lse, t0: int, plan: BandPlan, scale, dq, dk, dv):
    """Write dq, dk, dv of positions t0 .. T - 1 from the pairs among them (L .. L + b - 1
    positions): its first L + 1 rows are plain causal (one call, no mask), the rest a window
    (one masked call of at most b rows, over all of them: a mask no larger than the band's)."""
    T = q.shape[2]
    s = (slice(None), slice(None), slice(t0, T))
    g_t, q_t, k_t, v_t = (x[s] for x in (grad_out, q, k, v))
    o_t, l_t = out[s].to(q.dtype), lse[s].to(q.dtype)
    c = min(T - t0, plan.left + 1)  # causal rows: they see every key before them
    grads = flash_backward(
        g_t[:, :, :c], q_t[:, :, :c], k_t[:, :, :c], v_t[:, :, :c], o_t[:, :, :c],
        l_t[:, :, :c], 0.0, True, scale=scale,
    )  # fmt: skip
    for grad, gr in zip((dq, dk, dv), grads, strict=True):
        grad[:, :, t0 : t0 + c] = gr
    if c == T - t0:
        return
    rows = slice(c, T - t0)
    dq_r, dk_r, dv_r = flash_backward(
        g_t[:, :, rows], q_t[:, :, rows], k_t, v_t, o_t[:, :, rows], l_t[:, :, rows], 0.0,
        False, attn_mask=_window_mask(T - t0 - c, T - t0, plan.left, c, q), scale=scale,
    )  # fmt: skip
    dq[:, :, t0 + c :] = dq_r
    for grad, gr in ((dk, dk_r), (dv, dv_r)):
        grad[:, :, t0 : t0 + c] += gr[:, :, :c]  # (keys the causal rows saw too)
        grad[:, :, t0 + c :] = gr[:, :, c:]


def band_backward(q, k, v, grad_out, out, lse, plan: BandPlan, scale: float, dq, dk, dv):
    """Write all of dq (B, H, T, D), dk, dv (B, Hkv, T, D) of a causal window, from the
    global out (B, H, T, Dv) and lse (B, H, T). Transposed from the forward: KEY blocks of b,
    each with the L + b queries that see it, as kernel heads, so every key's gradient comes
    whole from one block (the kernel's dk, dv are b rows, not a band) and only dq, a band per
    block, is overlap-added. (Measured against query blocks with key bands, window 256 at
    T 8192, fwd + bwd: the kernel ~4% faster, and two of the three overlap-adds gone.)
    The last keys, whose queries would run past T, go in `_tail_backward`.

    A few blocks per kernel call: its band-sized dq then stays a few MB (measured: one call
    over every block spent a sixth of its time filling fresh buffers). Chunks run last to
    first, so a chunk's additions land on positions a later chunk (run before) or itself
    has written."""
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    b = plan.block
    n = _key_blocks(T, plan)
    _tail_backward(q, k, v, grad_out, out, lse, n * b, plan, scale, dq, dk, dv)
    mask = _window_mask(plan.width, b, plan.left, 0, q)  # (L + b, b): every key block's
    bands = [_query_band(x, n, plan) for x in (grad_out, q, out.to(q.dtype), lse.to(q.dtype))]
    keys = [x[:, :, : n * b].reshape(B, Hkv, n, b, -1) for x in (k, v)]
    if Hkv != H:  # the kernel's heads are blocks here, so grouped heads are repeated
        keys = [x.repeat_interleave(H // Hkv, dim=1) for x in keys]
    keys = [x.reshape(B * H, n, b, -1) for x in keys]
    per_call = max(1, CHUNK_ELEMENTS // (B * H * plan.width * D))
    for j0 in reversed(range(0, n, per_call)):
        j1 = min(n, j0 + per_call)
        blocks = slice(j0, j1)
        dq_t, dk_t, dv_t = flash_backward(
            *(x[:, blocks] for x in bands[:2]), *(x[:, blocks] for x in keys),
            *(x[:, blocks] for x in bands[2:]), 0.0, False, attn_mask=mask[None, None],
            scale=scale,
        )  # fmt: skip
        _overlap_add(dq, dq_t.view(B, H, j1 - j0, plan.width, D), j0 * b, plan)
        for grad, g in ((dk, dk_t), (dv, dv_t)):
            g = g.view(B, Hkv, H // Hkv, j1 - j0, b, -1)  # (the kernel's layout: no merge)
            dst = grad[:, :, j0 * b : j1 * b].unflatten(2, (j1 - j0, b))
            dst.copy_(g.sum(dim=2) if H != Hkv else g[:, :, 0])
