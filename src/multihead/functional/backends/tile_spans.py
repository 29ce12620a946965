"""The general tile plan's rows as batched spans: a query block whose tiles cover one
contiguous stretch of keys runs as ONE kernel call over that stretch (its span) under the
block's mask assembled from its tiles, and consecutive blocks whose spans have the same width
and move on by one block (a band: a causal window written as a `mask_mod`) run together, the
blocks as the kernel's batch and their spans as overlapping views of k and v (as tile_band.py
does for `window=`).

Why: torch's fused kernel pays a per-call cost and is slow on small causal tiles (a 128 x 128
causal tile 34 ns a pair forward + backward against 8 ns inside a long call; tile_band.py).
A window of 256 as a `mask_mod` with tiles of 128 made three calls per query block (a
partial tile, a full one, the diagonal), merged by log-sum-exp; as spans it makes one call per
run of blocks, each row over its whole span at once (no merge: every key it may see is in its
span, so the kernel's output and log-sum-exp are the row's own), at the price of the pairs the
span's mask blocks (a window of 256 over spans of 384: 1.5x its pairs).

Which rows: those whose tiles are contiguous and whose full tiles hold no more keys than their
partial and diagonal ones (a wide span of mostly full tiles stays on the tile path: one call
without a mask costs less than its span under a mask), on the fused kernel without dropout,
a key mask or a bias, and of whole blocks. Every other row runs tile by tile as before.

The masks: each span's (blocks, B or 1, H or 1, rows, keys) booleans are assembled once per
call from its tiles (a mask_mod's evaluations come from the classifier's cache, made when the
plan was) and kept on the call's `SpanCache` for the backward: no process-global state.

Shapes: q (B, H, Tq, D), k / v (B, Hkv, Tk, D); a run of n blocks of b rows with spans of w
keys starting s0, s0 + b, ..: the kernel's q (n, H, b, D), k / v (n, Hkv, w, D), mask
(n, H or 1, b, w); out (B, H, Tq, Dv), lse (B, H, Tq).
"""

from __future__ import annotations

import itertools
import threading
from typing import NamedTuple

import torch
from torch import Tensor

from ..tile_plan import Tile
from .tile_kernel import NEG_INF, flash_backward, flash_forward

MASK_ELEMENTS = 2**24  # the spans' masks of a call, at most (64 MB in fp32)
CHUNK_ELEMENTS = 2**18  # key-gradient span elements per backward call (1 MB in fp32)


class Span(NamedTuple):
    start: int  # its first key
    width: int  # keys


class Run(NamedTuple):
    """Consecutive query blocks first .. first + blocks - 1 (of `rows` rows each) whose spans
    start at start, start + rows, .. and are `width` keys wide."""

    first: int
    blocks: int
    rows: int
    start: int
    width: int


def row_span(tiles: list[Tile], rows: int) -> Span | None:
    """The span a plan row runs as (see the module docstring), or None: tile by tile."""
    if not tiles or any(t.q1 - t.q0 != rows for t in tiles):
        return None
    if any(a.k1 != b.k0 for a, b in itertools.pairwise(tiles)):
        return None  # a gap: the span would compute pairs no tile holds
    full = sum(t.k1 - t.k0 for t in tiles if t.full)
    masked = sum(t.k1 - t.k0 for t in tiles if not t.full)
    if full > masked:
        return None
    return Span(tiles[0].k0, tiles[-1].k1 - tiles[0].k0)


def runs(indexed: list[tuple[int, list[Tile]]], spans: list[Span | None], rows: int) -> list[Run]:
    """The runs among plan rows (query block index, tiles) with spans (per block index, None:
    tile by tile): consecutive blocks, equal widths, each span one block on from the last."""
    out: list[Run] = []
    for i, _ in indexed:
        span = spans[i]
        if span is None:
            continue
        last = out[-1] if out else None
        if (
            last is not None
            and last.first + last.blocks == i
            and last.width == span.width
            and last.start + last.blocks * rows == span.start
        ):
            out[-1] = last._replace(blocks=last.blocks + 1)
        else:
            out.append(Run(i, 1, rows, span.start, span.width))
    return out


def spans_fit(spans: list[Span | None], rows: int, pairs: int) -> bool:
    """Whether the spans' masks (float, `pairs` (batch row, head) pairs each) stay within
    MASK_ELEMENTS in all (they live from the forward to the backward)."""
    return sum(rows * s.width for s in spans if s is not None) * pairs <= MASK_ELEMENTS


class SpanCache:
    """A call's assembled span masks, made in the forward and read again in the backward
    (per call: it lives on the call's setup, shared by the units' threads)."""

    def __init__(self) -> None:
        self._masks: dict[tuple[int, int], SpanMask] = {}
        self._lock = threading.Lock()

    def get(self, run: Run, build) -> SpanMask:
        key = (run.first, run.blocks)
        with self._lock:
            found = self._masks.get(key)
        if found is None:
            found = build()
            with self._lock:
                self._masks[key] = found
        return found


class SpanMask(NamedTuple):
    """A run's mask, as its forward and backward read it."""

    additive: Tensor  # (n, B or 1, H or 1, rows, width): 0 where allowed, -inf elsewhere
    alive: Tensor  # (n, B or 1, H or 1, rows): rows with an allowed key
    parts: list[tuple[slice, int, int]] | None  # the forward's sub-blocks (`_sub_spans`)


def assemble(run: Run, rows_tiles: list[list[Tile]], tile_allowed, dtype) -> SpanMask:
    """The mask of a run: each block's tiles placed in its span. `tile_allowed(tile)` -> the
    tile's allowed pairs (broadcastable 4-D booleans), None for every pair, or "diagonal"
    (causality alone, on square positions)."""
    parts: list[list[tuple[int, int, Tensor | str]]] = []
    bm = hm = 1
    for m, tiles in enumerate(rows_tiles):
        s = run.start + m * run.rows
        row: list[tuple[int, int, Tensor | str]] = []
        for tile in tiles:
            a = tile_allowed(tile)
            if a is None:
                continue
            if isinstance(a, Tensor):
                a = a if a.dim() == 4 else a.view((1,) * (4 - a.dim()) + tuple(a.shape))
                bm, hm = max(bm, a.shape[0]), max(hm, a.shape[1])
            row.append((tile.k0 - s, tile.k1 - s, a))
        parts.append(row)
    allowed = torch.ones(run.blocks, bm, hm, run.rows, run.width, dtype=torch.bool)
    tril = None
    for m, row in enumerate(parts):
        for c0, c1, a in row:
            dst = allowed[m, :, :, :, c0:c1]
            if isinstance(a, str):  # "diagonal": square, top-left causal
                if tril is None:
                    tril = torch.ones(run.rows, run.rows, dtype=torch.bool).tril_()
                dst &= tril
            else:
                dst &= a
    additive = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, NEG_INF)
    return SpanMask(additive, allowed.any(dim=-1), _sub_spans(run, allowed))


def _blocks(x: Tensor, run: Run) -> Tensor:
    """A batch element's rows of the run's blocks: (H, T, ..) -> (n, H, b, ..), a view."""
    r0 = run.first * run.rows
    x = x[:, r0 : r0 + run.blocks * run.rows].unflatten(1, (run.blocks, run.rows))
    return x.transpose(0, 1)


def _spans(x: Tensor, run: Run) -> Tensor:
    """A batch element's keys of each block's span: (Hkv, T, D) -> (n, Hkv, w, D),
    overlapping views of x."""
    stretch = x[:, run.start : run.start + (run.blocks - 1) * run.rows + run.width]
    return stretch.unfold(1, run.width, run.rows).permute(1, 0, 3, 2)  # (Hkv, n, D, w) ->


FORWARD_ROWS = 32  # the forward's sub-blocks (see `run_forward`)


def _sub_spans(run: Run, allowed: Tensor) -> list[tuple[slice, int, int]] | None:
    """(rows within a block, first key, one past the last key in the span) of FORWARD_ROWS-row
    sub-blocks, the keys trimmed to those any of their rows may see in any block; None where
    that saves under a seventh of the pairs (one call over whole spans then)."""
    sub = FORWARD_ROWS
    if run.rows % sub or run.rows <= sub:
        return None
    # (rows / sub, w): whether any row of a sub-block, in any block, batch row, head, sees key
    seen = allowed.any(dim=(0, 1, 2)).unflatten(0, (run.rows // sub, sub)).any(dim=1)
    parts, pairs = [], 0
    for j, cols in enumerate(seen.tolist()):
        if True in cols:
            c0, c1 = cols.index(True), len(cols) - cols[::-1].index(True)
        else:
            c0 = c1 = 0
        parts.append((slice(j * sub, (j + 1) * sub), c0, c1))
        pairs += c1 - c0
    return parts if 7 * pairs * sub < 6 * run.rows * run.width else None


def run_forward(run: Run, mask: SpanMask, q, k, v, scale: float, out, lse) -> None:
    """Write out and lse of the run's rows (all batch elements): one kernel call each, or one
    per sub-block of FORWARD_ROWS rows over the keys it sees (the kernel's cost follows the
    keys of a call: a window of 256 over spans of 384 keys computes 288 per row then, as
    tile_band's forward does). A row with no allowed key gets out 0 (the kernel's) and lse
    -inf."""
    parts = mask.parts or [(slice(0, run.rows), 0, run.width)]
    for i in range(q.shape[0]):
        bi = i if mask.alive.shape[1] > 1 else 0
        q_b, o_b, l_b = (_blocks(x[i], run) for x in (q, out, lse))  # (n, H, b, ..) views
        for rows, c0, c1 in parts:
            if c0 == c1:  # no row here sees a key
                o_b[:, :, rows] = 0.0
                l_b[:, :, rows] = NEG_INF
                continue
            sub = run._replace(start=run.start + c0, width=c1 - c0)
            o, l = flash_forward(
                q_b[:, :, rows],
                _spans(k[i], sub),
                _spans(v[i], sub),
                attn_mask=mask.additive[:, bi, :, rows, c0:c1],
                scale=scale,
            )  # fmt: skip  (o (n, H, rows, Dv), l (n, H, rows); the mask (n, H or 1, rows, w'))
            o_b[:, :, rows] = o
            l_b[:, :, rows] = torch.where(mask.alive[:, bi, :, rows], l, NEG_INF)


def _add_spans(grad: Tensor, band: Tensor, run: Run, j0: int) -> None:
    """Add per-block span gradients (m, heads, w, D) of blocks j0.. into grad (heads, T, D) at
    run.start + (j0 + m) b + c: chunks of b columns land on stride-b views that do not
    overlap."""
    b, n, w = run.rows, band.shape[0], run.width
    st = grad.stride()
    s0 = run.start + j0 * b
    for j in range(0, w, b):
        cols = min(b, w - j)
        dst = grad.as_strided(
            (n, grad.shape[0], cols, grad.shape[2]),
            (b * st[1], st[0], st[1], st[2]),
            grad.storage_offset() + (s0 + j) * st[1],
        )
        dst += band[:, :, j : j + cols]


def run_backward(run: Run, mask: SpanMask, q, k, v, grad_out, out, lse, scale, dq, dk, dv):
    """The run's rows' dq written (whole: every key they see is in their spans), their share
    of dk and dv added (the spans overlap). Chunks of blocks keep the span-sized key gradients
    a few MB."""
    H, Hkv, D = q.shape[1], k.shape[1], q.shape[3]
    per_call = max(1, CHUNK_ELEMENTS // (Hkv * run.width * D))
    for i in range(q.shape[0]):
        m_i = mask.additive[:, i if mask.additive.shape[1] > 1 else 0]  # (n, H or 1, b, w)
        l_all = _blocks(lse[i], run).to(q.dtype)
        l_all = torch.where(l_all == NEG_INF, 0.0, l_all)  # rows with no key: all scores -inf
        bands = [_blocks(x[i], run) for x in (grad_out, q, out)]
        keys = [_spans(x[i], run) for x in (k, v)]
        for j0 in range(0, run.blocks, per_call):
            j1 = min(run.blocks, j0 + per_call)
            c = slice(j0, j1)
            g, q_b, o = (x[c] for x in bands)
            dq_t, dk_t, dv_t = flash_backward(
                g, q_b, keys[0][c], keys[1][c], o, l_all[c], 0.0, False,
                attn_mask=m_i[c], scale=scale,
            )  # fmt: skip
            r0 = (run.first + j0) * run.rows
            dq[i, :, r0 : r0 + (j1 - j0) * run.rows] = dq_t.transpose(0, 1).reshape(H, -1, D)
            _add_spans(dk[i], dk_t, run, j0)
            _add_spans(dv[i], dv_t, run, j0)
