"""Causal sliding windows as one batched kernel call instead of a loop over tiles.

With a causal window of W keys (query p sees keys p - L .. p, L = W - 1) and query blocks of
b rows, block i (rows q0 = i b .. q0 + b - 1; row r at position q0 + r) sees keys
q0 - L .. q0 + b - 1 (L + b of them), row r the columns c with r <= c <= r + L: the same band
for every block, so one (b, L + b) mask serves them all. One call of torch's fused CPU kernel
runs every block at once (the blocks become the kernel's batch, one call per batch element;
their keys are overlapping views of k and v, `Tensor.unfold`). Each row computes (L + b) / W
times its pairs (the forward runs blocks of 32 rows, FORWARD_BLOCK: 1.125x at W = 256).

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

Why blocks as the kernel's batch and heads as its heads (not the reverse): the kernel stores
its results (batch, rows, heads, D), so a block's results are whole (rows, H, D) runs of a
module's (T, H, D) projection layout: dk, dv and each overlap-added chunk of dq are copied in
runs of H D, not of D, grouped-query heads need no repeated keys (the kernel maps them), and
the kernel's own copy of grad_out and its dq buffer are in that order too. (Measured, window
256 at T 4096, module layout, 1 thread: backward 97.8 -> 94.8 ms, forward 41.2 -> 40.1 ms
against blocks as heads.)

Shapes: q (B, H, T, D), k / v (B, Hkv, T, D / Dv); out (B, H, T, Dv), lse (B, H, T); the
kernel layout per batch element (n, H, rows, D) with n = stop - first blocks; the mask
(1, 1, b, L + b).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .tile_kernel import additive_mask, flash_backward, flash_forward, serves_alone

# The backward's query gradients (the kernel's buffer) and its copy of grad_out are one
# (n, L + b, D) tensor per head: (L + b) / b copies of q. Wide windows get larger blocks to keep
# that to a few copies.
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
    """Rows of the planned blocks of one batch element: (H, T, D) -> (n, H, b, D), a view."""
    return x[:, plan.rows].unflatten(1, (plan.stop - plan.first, plan.block)).transpose(0, 1)


def _band(x: Tensor, plan: BandPlan) -> Tensor:
    """Each planned block's keys q0 - L .. q0 + b - 1, of one batch element: (Hkv, T, D) ->
    (n, Hkv, L + b, D), overlapping views of x (grouped-query heads stay grouped: the kernel
    maps them itself)."""
    s0 = plan.first * plan.block - plan.left
    span = x[:, s0 : plan.stop * plan.block]
    return span.unfold(1, plan.width, plan.block).permute(1, 0, 3, 2)  # (Hkv, n, D, L + b) ->


def _forward_plan(plan: BandPlan, T: int) -> BandPlan:
    """The forward's blocks: FORWARD_BLOCK rows where the window is that wide (the backward
    keeps the plan's: there a block's band-sized gradients must stay few copies of q; the
    forward's bands are views)."""
    b = min(plan.block, FORWARD_BLOCK)
    return plan._replace(block=b, first=-(-plan.left // b), stop=T // b)


def band_forward(q, k, v, plan: BandPlan, scale: float, out: Tensor, lse: Tensor) -> None:
    """Write out (B, H, T, Dv) and lse (B, H, T): the planned blocks in one call, the rows
    before them (whose band would reach before key 0) and after them (a last block shorter
    than b) in `_edge_forward`."""
    B, H, T, _ = q.shape
    plan = _forward_plan(plan, T)
    n, b = plan.stop - plan.first, plan.block
    # (b, L + b): block row r sits at key column r + L of its band
    mask = _window_mask(plan.block, plan.width, plan.left, plan.left, q)[None, None]
    for i in range(B):  # (blocks are the kernel's batch; batch elements one call each)
        o, l = flash_forward(
            _blocks(q[i], plan), _band(k[i], plan), _band(v[i], plan), attn_mask=mask, scale=scale
        )  # o (n, H, b, Dv), stored (n, b, H, Dv): a module's (T, H, Dv) rows
        out[i, :, plan.rows] = o.transpose(0, 1).reshape(H, n * b, -1)
        lse[i, :, plan.rows] = l.transpose(0, 1).reshape(H, n * b)
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


def overlap_add(grad: Tensor, band: Tensor, s0: int, b: int, width: int) -> None:
    """Per-block bands (n, heads, width, D) of one batch element into its grad (heads, T, D)
    at positions s0 + i b + c (block i of b rows, column c): each block's first b positions
    written (they tile s0 .. s0 + n b once), the rest added (consecutive blocks' bands
    overlap there). Shared with the masked band (tile_masked_band.py)."""
    n = band.shape[0]
    st = grad.stride()
    for j in range(0, width, b):  # chunk j of every band lands on one stride-b view
        w = min(b, width - j)
        # positions s0 + j + i b + c (block i, c < w <= b): views that do not overlap
        dst = grad.as_strided(
            (n, grad.shape[0], w, grad.shape[2]),
            (b * st[1], st[0], st[1], st[2]),
            grad.storage_offset() + (s0 + j) * st[1],
        )
        if j == 0:
            dst.copy_(band[:, :, :w])
        else:
            dst += band[:, :, j : j + w]


def _key_blocks(T: int, plan: BandPlan) -> int:
    """How many key blocks the backward runs as bands: key block j (keys j b .. j b + b - 1)
    is seen by queries j b .. j b + L + b - 1, which must all exist."""
    return (T - plan.width) // plan.block + 1


def _query_band(x: Tensor, n: int, plan: BandPlan) -> Tensor:
    """Each key block's queries j b .. j b + L + b - 1 of one batch element, overlapping
    views of x: (H, T, ..) -> (n, H, L + b, ..) (no copy)."""
    span = x[:, : (n - 1) * plan.block + plan.width].unfold(1, plan.width, plan.block)
    if x.dim() == 3:
        return span.permute(1, 0, 3, 2)  # (H, n, D, L + b) -> (n, H, L + b, D)
    return span.transpose(0, 1)  # (H, n, L + b) -> (n, H, L + b)


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
    each with the L + b queries that see it, as the kernel's batch, so every key's gradient comes
    whole from one block (the kernel's dk, dv are b rows, not a band) and only dq, a band per
    block, is overlap-added. (Measured against query blocks with key bands, window 256 at
    T 8192, fwd + bwd: the kernel ~4% faster, and two of the three overlap-adds gone.)
    The last keys, whose queries would run past T, go in `_tail_backward`.

    A few blocks per kernel call: its band-sized dq then stays a few MB (measured: one call
    over every block spent a sixth of its time filling fresh buffers). Chunks run last to
    first, so a chunk's additions land on positions a later chunk (run before) or itself
    has written."""
    B, H, T, D = q.shape
    b = plan.block
    n = _key_blocks(T, plan)
    _tail_backward(q, k, v, grad_out, out, lse, n * b, plan, scale, dq, dk, dv)
    mask = _window_mask(plan.width, b, plan.left, 0, q)[None, None]  # (L + b, b): every block's
    per_call = max(1, CHUNK_ELEMENTS // (H * plan.width * D))
    out, lse = out.to(q.dtype), lse.to(q.dtype)
    for i in range(B):  # (key blocks are the kernel's batch; batch elements one call each)
        bands = [_query_band(x[i], n, plan) for x in (grad_out, q, out, lse)]
        keys = [_blocks(x[i], plan._replace(first=0, stop=n)) for x in (k, v)]  # key blocks
        for j0 in reversed(range(0, n, per_call)):
            j1 = min(n, j0 + per_call)
            blocks = slice(j0, j1)
            dq_t, dk_t, dv_t = flash_backward(
                *(x[blocks] for x in bands[:2]), *(x[blocks] for x in keys),
                *(x[blocks] for x in bands[2:]), 0.0, False, attn_mask=mask, scale=scale,
            )  # fmt: skip
            overlap_add(dq[i], dq_t, j0 * b, b, plan.width)  # dq_t (blocks, H, L + b, D)
            for grad, g in ((dk, dk_t), (dv, dv_t)):  # (blocks, Hkv, b, D): the kernel sums groups
                grad[i, :, j0 * b : j1 * b] = g.transpose(0, 1).flatten(1, 2)
