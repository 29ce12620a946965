"""The tiled backend: attention that costs the pairs it allows. It reads a call's structure
(window, documents, prefix, a mask_mod; see `functional.structure`, `functional.mask_mod`) and
visits only the tiles that hold an allowed pair (`functional.tile_plan`): full tiles without a
mask, partial tiles with a small one, merged by log-sum-exp with the tile code ring attention
uses (`functional.tiles`). The backward pass recomputes each tile from the saved log-sum-exp.
No (Tq, Tk) tensor is built.

It is the default on CPU for structured calls above a small size (`tiled_prefer`), with or
without attention dropout (keep masks per tile, `functional.dropout_mask`); on other
devices `auto` leaves them to the fused kernels (with the dense mask). A query row with no
allowed key returns zeros (output and gradients); NaN in q, k, v or bias reaches the rows that
attend to it.

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) -> out (B, H, Tq, Dv);
lse (B, H, Tq); mask / bias 4-D, broadcastable to (B, H, Tq, Tk).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ...value_checks import may_read
from ..call import AttentionCall, variant_reasons
from ..dropout_mask import dropout_keep_mask
from ..first_order import first_order
from ..mask_band import band_of_documents, band_of_grid
from ..mask_documents import documents_of
from ..mask_mod import TileClassifier, mod_mask
from ..mask_plan import MaskPlan, causal_window, grid_of_rows
from ..structure import Structure, structure_mask
from ..tile_plan import Tile, block_rows, block_size, plan_tiles
from ..tiles import NEG_INF, accumulation_dtype, merge_into, tile_backward, tile_forward
from .tile_band import BandPlan, band_backward, band_forward, band_plan
from .tile_intervals import (
    Intervals,
    held_intervals,
    interval_backward,
    interval_forward,
    interval_plan,
    interval_runs,
    segments_intervals,
    structure_intervals,
)
from .tile_kernel import kernel_backward, kernel_forward, kernel_runs
from .tile_masked_band import (
    FORWARD_BLOCK,
    MaskedBand,
    masked_band_backward,
    masked_band_forward,
    masked_band_plan,
)
from .tile_packed import PackedViews, packed_views, take_views
from .tile_prefix import prefix_backward, prefix_forward, prefix_plan
from .tile_segments import held_segments, segment_plan, segments_backward, segments_forward
from .tile_spans import (
    Span,
    SpanCache,
    SpanMask,
    assemble,
    row_span,
    run_backward,
    run_forward,
    runs,
    spans_fit,
)
from .tile_threads import head_units, per_call, row_groups, run, workers

# Below this many (query, key) pairs per head, sdpa under the dense mask (at most 1 MB of
# booleans) is as cheap as tiling or cheaper (measured: documents of 64 tokens at T = 512
# ran faster dense; every case at T = 1024 ran faster tiled).
MIN_PAIRS = 1024 * 1024


def tiled_why_not(call: AttentionCall) -> list[str]:
    reasons = []
    if call.return_weights:
        reasons.append("it cannot return attention weights (the eager backend can)")
    if torch.compiler.is_compiling():
        # Dynamo cannot trace its autograd.Function (a plan of Python tiles): compiled code
        # runs sdpa under the dense mask instead, which traces.
        reasons.append("it does not trace under torch.compile (sdpa with the dense mask does)")
    reasons.extend(variant_reasons(call, "the tiled backend"))
    return reasons


def tiled_prefer(call: AttentionCall) -> bool:
    """auto runs a call here when it has structure, runs on CPU, and is big enough to pay."""
    return (
        call.structure is not None
        and call.q.device.type == "cpu"
        and call.q.shape[2] * call.k.shape[2] >= MIN_PAIRS
    )


def tiled_attention(call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    q, k, v, mask, bias = call.q, call.k, call.v, call.mask, call.bias
    # torch's bare CPU kernel (tile_kernel.flash_forward: the fast paths call it on q, k, v
    # as given) reads the head dimension as contiguous without checking; a head_dim stride
    # other than 1 (a (B, T, D, H) layout permuted, a strided slice) gave garbage, NaN and
    # 1e20 included. Public SDPA sends such inputs to its math backend; here they are copied.
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    structure = call.structure
    B, H, tq, _ = q.shape
    tk = k.shape[2]
    # Three common shapes skip the general plan: a causal window alone runs as one batched
    # kernel call over a band (tile_band.py), documents in contiguous runs as calls per document
    # (tile_segments.py), an int prefix as three large calls (tile_prefix.py). A mask inside a
    # causal band (a window within documents; a mask_mod whose pairs all lie within L keys
    # before their query) runs as the band does, each block under its own mask
    # (tile_masked_band.py), where that costs less than the general plan's tiles.
    # Attention dropout runs the plain-torch tiles, each with its keep mask from a seed and the
    # entries' global coordinates (`functional.dropout_mask`, ring attention's rule), so the
    # backward pass recomputes exactly the entries the forward pass dropped.
    dropout = None
    if call.dropout_p > 0.0:
        dropout = (call.dropout_p, _draw_seed())
    fused = kernel_runs(q, v) and dropout is None
    kind: TileClassifier | MaskPlan | None = None
    block: int | tuple[int, int] = block_size(structure)
    if structure is not None and structure.mask_mod is not None and structure.block is not None:
        # A mask_mod's tiles: classified where reading is free, from a held plan's
        # classification (`mask_plan.block_mask`) or here, evaluated one strip at a time.
        block, held = structure.block, structure.mask_mod
        if isinstance(held, MaskPlan) and held.serves(q.device):
            kind = held
        else:
            kind = TileClassifier(held, B, H, tq, tk, q.device, may_read(q))
    band = band_plan(structure, call.causal, mask, bias, q, k) if fused else None
    if fused and isinstance(kind, MaskPlan) and kind.window is not None and _mod_alone(structure):
        # the held plan is exactly a causal window: the band fast path, as for window=
        band = band_plan(Structure(window=(kind.window, 0)), True, mask, bias, q, k)
    segments = segment_plan(structure, mask, bias, q, k) if fused else None
    # a held plan that is exactly causal documents: the documents fast path on their ids
    ids = None
    if isinstance(kind, MaskPlan) and _mod_alone(structure) and fused and band is None:
        ids = kind.documents_for(call.causal)
    if ids is not None:
        segments = held_segments(ids, mask, bias, q, k)
    causal = call.causal or (ids is not None and segments is not None)
    prefix_p = prefix_plan(structure, call.causal, mask, bias, q, k) if fused else None
    rows = []
    masked = None
    # The interval kernel (tile_intervals.py: each row one interval of keys, exactly the
    # allowed pairs) where it takes the inputs: documents (their runs), window= with
    # documents=, a held plan (nothing beside it) whose rows are intervals
    intervals = None
    if segments is not None and interval_runs(q, k, v) and tq == tk:
        intervals, segments = segments_intervals(segments, B, tq, causal), None
    if intervals is None and fused:
        intervals = structure_intervals(structure, call.causal, mask, bias, q, k)
    held_alone = isinstance(kind, MaskPlan) and _mod_alone(structure) and band is None
    if intervals is None and fused and held_alone and segments is None and mask is None:
        intervals = held_intervals(kind, call.causal, q, k) if bias is None else None
    if band is None and segments is None and prefix_p is None and intervals is None:
        rows = _plan(structure, call.causal, B, H, tq, tk, block, kind, q, k, v)
        if fused and isinstance(kind, TileClassifier):
            band, segments, masked = _classified_fast_path(
                kind, rows, structure, call.causal, block, mask, bias, q, k
            )
            causal = call.causal or segments is not None
        elif fused:
            masked = _plan_band(kind, rows, structure, call.causal, block, mask, bias, q, k)
        if band is not None or segments is not None or masked is not None:
            rows = []
    # a causal window, or a band whose rows are each one interval of keys: the interval
    # kernel (tile_intervals.py: exactly the allowed pairs) where it takes the inputs
    if intervals is None and fused:
        intervals = interval_plan(band, masked, mask, bias, q, k)
    if intervals is not None:
        band = masked = None
    if band is not None:
        block = band.block
    indexed = list(enumerate(rows))  # (query block index, its tiles)
    rows_per_block = block_rows(block)
    # rows whose tiles make one span run as batched spans (tile_spans.py): fused, no dropout,
    # key mask or bias; None: tile by tile
    spans: list[Span | None] = [None] * len(rows)
    if fused and mask is None and bias is None:
        spans = [row_span(tiles, rows_per_block) for tiles in rows]
        if not spans_fit(spans, rows_per_block, _mask_heads(structure, kind, B, H)):
            spans = [None] * len(rows)  # their masks would be too large: tile by tile
    docs = None if structure is None else structure.documents
    prefix = None if structure is None else structure.prefix
    prefix_t = prefix if isinstance(prefix, Tensor) else None
    setup = _Setup(
        # (documents recognised in a mask_mod are causal inside: the segments run causal)
        indexed, block, band, segments, prefix_p, structure, causal, call.scale, dropout,
        spans, {} if kind is None else kind.masks, _span_cache(kind, structure, call.causal, q),
        masked, intervals,
    )  # fmt: skip
    # The general plan's tiles slice q, k, v along the sequence: from a module's (B, T, H, D)
    # projections those are strided views, slower to read tile by tile than one contiguous
    # copy. (The fast paths' few large calls, and the spans' batched ones, read strided
    # inputs at full speed.)
    if _tile_rows(setup):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    # q, k, v as a module's own views of its projection (columns or blocks): the Function
    # takes the projection itself and writes its gradient in one buffer (tile_packed.py)
    packed = None
    if call.own_views and accumulation_dtype(q.dtype) == q.dtype:
        packed = packed_views(q, k, v)
    with torch.autocast(q.device.type, enabled=False):  # the tiles state their own precision
        if packed is not None:
            out = _TiledPacked.apply(packed.base, mask, bias, docs, prefix_t, setup, packed)
        else:
            out = _Tiled.apply(q, k, v, mask, bias, docs, prefix_t, setup)
    return out, None


def _plan(structure, causal, B, H, tq, tk, block, kind, q, k, v) -> list[list[Tile]]:
    """`plan_tiles`; a mask_mod's (whose classification evaluates it on every tile the
    structure lets through) in units of consecutive query blocks on the workers, each unit
    blocks of about equal pairs (counted first from the structure alone)."""
    if kind is None or isinstance(kind, MaskPlan):  # (a held plan's kinds: a lookup)
        return plan_tiles(structure, causal, B, H, tq, tk, block, kind)
    with torch.no_grad():  # (index tensors only: nothing for autograd to record)
        n = workers(q, k, v)
    if n <= 1:
        return plan_tiles(structure, causal, B, H, tq, tk, block, kind)
    pairs = [_weight(r) for r in plan_tiles(structure, causal, B, H, tq, tk, block, None)]
    groups = row_groups(pairs, n)
    parts: list[list[list[Tile]]] = [[] for _ in groups]

    def unit(j: int) -> None:
        parts[j] = plan_tiles(structure, causal, B, H, tq, tk, block, kind, groups[j])

    with torch.no_grad():
        run([functools.partial(unit, j) for j in range(len(groups))], n)
    return [row for part in parts for row in part]


def _span_cache(kind, structure: Structure | None, causal: bool, q: Tensor) -> SpanCache:
    """Where the spans' assembled masks live: on a held plan with nothing beside it (they
    follow from the plan, causality and dtype alone: assembled once, in its first call's
    forward), else on this call."""
    if isinstance(kind, MaskPlan) and _mod_alone(structure):
        return kind.span_cache((causal, q.dtype))
    return SpanCache()


def _classified_fast_path(
    kind, rows, structure, causal, block, mask, bias, q, k
) -> tuple[BandPlan | None, list | None, MaskedBand | None]:
    """(band, segments, masked): the band fast path's plan where a mask_mod classified by
    this call (no window, documents, prefix, mask or bias beside it) is exactly a causal
    window, else the documents fast path's runs where it is exactly causal documents in
    contiguous runs (`mask_documents`), else the masked band's plan where every pair it
    allows lies in a causal band cheaper than the plan's tiles (`mask_band`); all None
    otherwise. The classified grid is built once for all three."""
    if not kind.readable or mask is not None or bias is not None or not _mod_alone(structure):
        return None, None, None
    pair = (block, block) if isinstance(block, int) else block
    tq, tk = q.shape[2], k.shape[2]
    grid = grid_of_rows(rows, kind.masks, causal, pair, tq, tk)
    if grid is None:
        return None, None, None
    left = causal_window(*grid, pair, tq, tk)
    if left is not None:
        return band_plan(Structure(window=(left, 0)), True, None, None, q, k), None, None
    ids = documents_of(*grid, pair, tq, tk)
    if ids is not None:
        segments = held_segments(ids, mask, bias, q, k)
        if segments is not None:
            return None, segments, None
    found = band_of_grid(*grid, causal, pair, tq, tk, _band_left(rows, tq, block))
    return None, None, masked_band_plan(found, mask, bias, q, k)


def _band_left(rows: list[list[Tile]], T: int, block) -> int:
    """The widest band (L) that costs no more than the plan's tiles: its L + b keys a row
    against the keys a row of the tiles computes, two thirds of them for tiles of 128 rows
    or more (larger kernel calls run each pair cheaper: measured, a window of 64 within
    documents of 128 at T 1024, one thread, where the plan's tiles compute 128 keys a row,
    the band's 95 took 1.10x the plan's time; within documents of 512, 256 keys a row,
    0.65x; at tiles of 64, 128 keys a row, 0.82x)."""
    per_row = sum(_weight(r) for r in rows) // max(1, T)
    if block_rows(block) >= 128:
        per_row = per_row * 2 // 3
    return per_row - FORWARD_BLOCK


def _plan_band(kind, rows, structure, causal, block, mask, bias, q, k) -> MaskedBand | None:
    """The masked band's plan (`tile_masked_band`) of a call the general plan would run,
    where it computes fewer pairs than the plan's tiles: a causal window within documents
    (`window=` with `documents=`, nothing else), or a held plan (nothing beside it) whose
    pairs all lie in a causal band (found once per plan and causality, kept on the plan)."""
    if mask is not None or bias is not None or structure is None or not rows:
        return None
    T = q.shape[2]
    if isinstance(kind, MaskPlan):
        if not _mod_alone(structure):
            return None
        pair = (block, block) if isinstance(block, int) else block

        def build() -> MaskedBand | None:
            assert kind.kinds is not None
            found = band_of_grid(
                kind.kinds, kind.masks, causal, pair, T, k.shape[2], _band_left(rows, T, block)
            )
            return None if found is None else masked_band_plan(found, None, None, q, k)

        return kind.held(("masked band", causal), build)
    window, docs = structure.window, structure.documents
    if kind is not None or window is None or docs is None or structure.prefix is not None:
        return None
    if not (causal or window[1] == 0) or window[0] < 1:
        return None
    left = window[0]
    if left > _band_left(rows, T, block) or docs.shape[1] != T:
        return None
    return masked_band_plan(band_of_documents(docs, left), None, None, q, k)


def _mod_alone(structure: Structure | None) -> bool:
    """A mask_mod and no window, documents or prefix beside it."""
    return (
        structure is not None
        and structure.window is None
        and structure.documents is None
        and structure.prefix is None
    )


def _mask_heads(structure: Structure | None, kind, B: int, H: int) -> int:
    """How many (batch row, head) pairs the spans' masks may differ in: the mask_mod's
    evaluated tiles' (B or 1) x (H or 1), B where documents or a per-row prefix cut them, B H
    where the mask_mod was not read."""
    b = h = 1
    if structure is not None and (
        structure.documents is not None or isinstance(structure.prefix, Tensor)
    ):
        b = B
    if kind is not None:
        if not kind.readable:
            return B * H
        for tile in kind.masks.values():
            b, h = max(b, tile.shape[0]), max(h, tile.shape[1])
    return b * h


class _Setup(NamedTuple):
    """What the autograd.Function's forward and backward share besides tensors."""

    rows: list  # (query block index, its tiles) the general plan runs
    block: int | tuple[int, int]  # rows (and keys) per block of the plan
    band: BandPlan | None  # the causal-window fast path
    segments: list | None  # the documents fast path
    prefix: int | None  # the prefix fast path's P
    structure: Structure | None
    causal: bool
    scale: float
    dropout: tuple[float, int] | None  # (p, seed)
    spans: list  # per query block, its Span when it runs as one (tile_spans.py), else None
    masks: dict  # the mask_mod's evaluated partial tiles, by (q0, q1, k0, k1), from the plan
    span_masks: SpanCache  # the spans' assembled masks, made in forward, read in backward
    masked: MaskedBand | None = None  # a mask inside a causal band (tile_masked_band.py)
    intervals: Intervals | None = None  # one key interval per row (tile_intervals.py)


def _tile_rows(setup: _Setup) -> bool:
    """Whether some plan row runs tile by tile (not as a span)."""
    return any(tiles and setup.spans[i] is None for i, tiles in setup.rows)


def _draw_seed() -> int:
    """A dropout seed from torch's default CPU generator (so torch.manual_seed repeats a run);
    a host integer, read from the CPU generator whatever the inputs' device."""
    return int(torch.randint(0, 2**62, (), dtype=torch.long))


def _keep(tile: Tile, dropout, B: int, H: int, offset: int, device) -> Tensor | None:
    """The tile's (B, H, rows, keys) dropout keep mask, None without dropout. Coordinates are
    positions among the keys, queries bottom-right aligned (as the structure's)."""
    if dropout is None:
        return None
    p, seed = dropout
    rows = torch.arange(tile.q0 + offset, tile.q1 + offset, device=device)
    keys = torch.arange(tile.k0, tile.k1, device=device)
    return dropout_keep_mask(seed, p, B, H, rows, keys)


def _slice(t: Tensor | None, tile: Tile) -> Tensor | None:
    """The tile's rows and keys of a 4-D mask / bias (broadcast dims of size 1 stay 1)."""
    if t is None:
        return None
    if t.shape[2] != 1:
        t = t[:, :, tile.q0 : tile.q1]
    return t if t.shape[3] == 1 else t[..., tile.k0 : tile.k1]


def _and(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    return a if b is None else b if a is None else a & b


def _tile_masks(tile: Tile, mask, bias, setup: _Setup, q, tk, fused):
    """(allowed, bias, kernel-causal) of one tile: a diagonal tile with nothing else to mask
    runs the fused kernel's own causality, with no mask at all. A tile the mask_mod cuts
    takes its evaluation from the plan's classification, or evaluates it here, on this tile
    only (where the classifier did not read it, or kept no more)."""
    structure, causal = setup.structure, setup.causal
    if fused and tile.diagonal and mask is None and bias is None:
        return None, None, True
    allowed = _slice(mask, tile)
    B, H, tq, _ = q.shape
    if not tile.full:
        s = structure if structure is not None else Structure()
        allowed = _and(
            allowed, structure_mask(s, causal, tile.q0, tile.q1, tile.k0, tile.k1, tq, tk, q.device)
        )
        if tile.mod and s.mask_mod is not None:
            own = setup.masks.get((tile.q0, tile.q1, tile.k0, tile.k1))
            if own is None:
                own = mod_mask(
                    s.mask_mod, B, H, tile.q0, tile.q1, tile.k0, tile.k1, tq, tk, q.device
                )
            allowed = _and(allowed, own)
    return allowed, _slice(bias, tile), False


def _output_buffer(q: Tensor, dv: int, dtype) -> Tensor:
    """(B, H, Tq, Dv), uninitialised, laid out as q is: a module's q is a (B, Tq, H, D)
    projection seen heads-first, and an output stored (B, Tq, H, Dv) gives its out_proj the
    (B, Tq, H Dv) rows it reads by a view (torch's own CPU kernel stores its output so)."""
    B, H, tq, _ = q.shape
    if H > 1 and tq > 1 and q.stride(1) < q.stride(2):
        return torch.empty(B, tq, H, dv, dtype=dtype, device=q.device).transpose(1, 2)
    return torch.empty(B, H, tq, dv, dtype=dtype, device=q.device)


def _segments_of(segments: list, rows: slice) -> list:
    """The documents of a unit's batch rows, numbered within them."""
    if rows.start is None:
        return segments
    return [(b - rows.start, s, e) for b, s, e in segments if rows.start <= b < rows.stop]


def _dense_pairs(q: Tensor, k: Tensor) -> int:
    """B x H x Tq x Tk: the size of a call for the per-call thread choice (`per_call`)."""
    B, H, tq, _ = q.shape
    return B * H * tq * k.shape[2]


def _fast_forward(setup: _Setup, q, k, v, out, lse) -> None:
    """The call's fast path (band, documents or prefix), forward: units of batch rows and kv
    heads on worker threads (`tile_threads`: each unit writes its own rows of out, lse)."""
    n = per_call(workers(q, k, v, out), _dense_pairs(q, k))
    units: list[Callable[[], None]] = []
    for rows, heads, kv in head_units(q.shape[0], q.shape[1], k.shape[1], n):
        t = (q[rows, heads], k[rows, kv], v[rows, kv])
        o, l = out[rows, heads], lse[rows, heads]
        if setup.band is not None:
            units.append(functools.partial(band_forward, *t, setup.band, setup.scale, o, l))
        elif setup.segments is not None:
            segs = _segments_of(setup.segments, rows)
            units.append(
                functools.partial(segments_forward, *t, segs, setup.causal, setup.scale, o, l)
            )
        else:
            units.append(
                functools.partial(prefix_forward, *t, setup.prefix or 0, setup.scale, o, l)
            )
    run(units, n)


def _fast_backward(setup: _Setup, q, k, v, grad_out, out, lse, dq, dk, dv) -> None:
    """The fast path's backward, in the same units (each writes its own heads' dq, dk, dv)."""
    n = per_call(workers(q, k, v, grad_out, out, dq), _dense_pairs(q, k))
    units: list[Callable[[], None]] = []
    for rows, heads, kv in head_units(q.shape[0], q.shape[1], k.shape[1], n):
        t = (q[rows, heads], k[rows, kv], v[rows, kv])
        g, o, l = grad_out[rows, heads], out[rows, heads], lse[rows, heads]
        d = (dq[rows, heads], dk[rows, kv], dv[rows, kv])
        scale = setup.scale
        if setup.band is not None:
            units.append(functools.partial(band_backward, *t, g, o, l, setup.band, scale, *d))
        elif setup.segments is not None:
            segs = _segments_of(setup.segments, rows)
            units.append(
                functools.partial(segments_backward, *t, g, o, l, segs, setup.causal, scale, *d)
            )
        else:
            units.append(
                functools.partial(prefix_backward, *t, g, o, l, setup.prefix or 0, scale, *d)
            )
    run(units, n)


def _forward(q, k, v, mask, bias, setup) -> tuple[Tensor, Tensor]:
    B, H, tq, _ = q.shape
    acc = accumulation_dtype(q.dtype)
    # Every row is written below (a fast path's, a plan row's first span, or zeros for a row
    # with nothing to attend), so the buffers start uninitialised.
    out = _output_buffer(q, v.shape[3], acc)
    lse = torch.empty((B, H, tq), dtype=acc, device=q.device)
    if setup.band is not None or setup.segments is not None or setup.prefix is not None:
        _fast_forward(setup, q, k, v, out, lse)
    if setup.masked is not None:
        _masked_forward(setup.masked, setup.scale, q, k, v, out, lse)
    if setup.intervals is not None:
        iv = setup.intervals
        lo, hi = iv.lo.expand(B, H, tq), iv.hi.expand(B, H, tq)
        interval_forward(q, k, v, lo, hi, setup.scale, out, lse, iv.pairs(B, H))
    if setup.rows:
        _plan_forward(setup, q, k, v, mask, bias, out, lse)
    return out, lse


def _masked_forward(plan: MaskedBand, scale, q, k, v, out, lse) -> None:
    """The masked band, forward: units of batch rows and kv heads on worker threads (as the
    fast paths'); its block masks made first, here (once per plan and dtype)."""
    plan.mask("forward", q.dtype)
    n = per_call(workers(q, k, v, out), _dense_pairs(q, k))
    run(
        [
            functools.partial(masked_band_forward, q[r, h], k[r, kv], v[r, kv], plan, scale,
                              out[r, h], lse[r, h], r, h)
            for r, h, kv in head_units(q.shape[0], q.shape[1], k.shape[1], n)
        ],
        n,
    )  # fmt: skip


def _masked_backward(plan: MaskedBand, scale, q, k, v, grad_out, out, lse, dq, dk, dv) -> None:
    """The masked band, backward, in the same units (each writes its own heads' gradients)."""
    plan.mask("backward", q.dtype)
    n = per_call(workers(q, k, v, grad_out, out, dq), _dense_pairs(q, k))
    run(
        [
            functools.partial(masked_band_backward, q[r, h], k[r, kv], v[r, kv], grad_out[r, h],
                              out[r, h], lse[r, h], plan, scale, dq[r, h], dk[r, kv], dv[r, kv],
                              r, h)
            for r, h, kv in head_units(q.shape[0], q.shape[1], k.shape[1], n)
        ],
        n,
    )  # fmt: skip


def _weight(tiles: list[Tile]) -> int:
    """The pairs a plan row's tiles compute (how the rows are shared among the units)."""
    return sum((t.q1 - t.q0) * (t.k1 - t.k0) for t in tiles)


def _plan_forward(setup: _Setup, q, k, v, mask, bias, out, lse) -> None:
    """The general plan, forward: units of consecutive query blocks on worker threads
    (`tile_threads`: each unit writes its own rows of out and lse, every batch row and head)."""
    rows = setup.rows
    n = workers(q, k, v, mask, bias, out)
    groups = row_groups([_weight(tiles) for _, tiles in rows], n)
    units = [
        functools.partial(_plan_rows_forward, setup, [rows[j] for j in g], q, k, v, mask, bias,
                          out, lse)
        for g in groups
    ]  # fmt: skip
    run(units, n)


def _plan_rows_forward(setup: _Setup, rows, q, k, v, mask, bias, out, lse) -> None:
    """Plan rows (query block index, its tiles) into out and lse: the spans' runs first,
    then the other rows tile by tile."""
    block, scale, dropout = setup.block, setup.scale, setup.dropout
    B, H, tq, _ = q.shape
    tk = k.shape[2]
    fused = kernel_runs(q, v) and dropout is None
    rows_per_block = block_rows(block)
    for span_run in runs(rows, setup.spans, rows_per_block):
        allowed = _span_mask(setup, span_run, q, tk)
        run_forward(span_run, allowed, q, k, v, scale, out, lse)
    for i, tiles in rows:
        if setup.spans[i] is not None:
            continue
        if not tiles:
            r = slice(i * rows_per_block, (i + 1) * rows_per_block)
            out[:, :, r] = 0.0
            lse[:, :, r] = NEG_INF
        for n, tile in enumerate(tiles):
            allowed, bias_t, diagonal = _tile_masks(tile, mask, bias, setup, q, tk, fused)
            q_t, k_t = q[:, :, tile.q0 : tile.q1], k[:, :, tile.k0 : tile.k1]
            v_t = v[:, :, tile.k0 : tile.k1]
            if fused:
                o, l = kernel_forward(q_t, k_t, v_t, allowed, bias_t, scale, diagonal)
            else:
                o, l = tile_forward(
                    q_t, k_t, v_t, scale=scale, allowed=allowed, bias=bias_t,
                    keep=_keep(tile, dropout, B, H, tk - tq, q.device),
                    dropout_p=0.0 if dropout is None else dropout[0],
                )  # fmt: skip
            if n == 0:  # the row's first span: nothing to merge with yet
                out[:, :, tile.q0 : tile.q1] = o
                lse[:, :, tile.q0 : tile.q1] = l
            else:
                merge_into(out[:, :, tile.q0 : tile.q1], lse[:, :, tile.q0 : tile.q1], o, l)


def _span_mask(setup: _Setup, run, q, tk) -> SpanMask:
    """A run's assembled mask, made once per call (in its forward; the backward reads it)."""
    tiles = dict(setup.rows)

    def tile_allowed(tile: Tile):
        allowed, _, diagonal = _tile_masks(tile, None, None, setup, q, tk, True)
        return "diagonal" if diagonal else allowed

    def build() -> SpanMask:
        blocks = [tiles[i] for i in range(run.first, run.first + run.blocks)]
        return assemble(run, blocks, tile_allowed, q.dtype)

    return setup.span_masks.get(run, build)


def _add_bias_grad(grad: Tensor, ds: Tensor, bias: Tensor, tile: Tile) -> None:
    """Add a tile's score gradient ds (B, H, rows, keys) to the bias's own (broadcast) shape."""
    dims = [d for d in range(4) if bias.shape[d] == 1 and ds.shape[d] != 1]
    if dims:
        ds = ds.sum(dim=dims, keepdim=True)
    rows = slice(None) if bias.shape[2] == 1 else slice(tile.q0, tile.q1)
    keys = slice(None) if bias.shape[3] == 1 else slice(tile.k0, tile.k1)
    grad[:, :, rows, keys] += ds


def _gradient_buffers(q, k, v, setup: _Setup, acc, packed: PackedViews | None):
    """dq, dk, dv (B, H or Hkv, T, D) for the backward to fill, and the fused projection's
    gradient they are views of (None unless `packed`). The fast paths write every gradient
    they own (the band's backward: all of them), so their buffers start uninitialised; the
    general plan adds tile by tile into zeros."""
    writes = (
        setup.segments is not None or setup.prefix is not None or setup.band is not None
        or setup.masked is not None or setup.intervals is not None
    )  # fmt: skip
    if packed is not None:
        fill = torch.empty if writes and packed.covers else torch.zeros
        grad_base = fill(packed.base.shape, dtype=acc, device=q.device)
        dq, dk, dv = take_views(grad_base, packed.views)
    else:
        grad_base = None
        fill = torch.empty if writes else torch.zeros
        dq, dk, dv = (fill(t.shape, dtype=acc, device=q.device) for t in (q, k, v))
    return dq, dk, dv, grad_base


def _backward(q, k, v, mask, bias, out, lse, grad_out, setup: _Setup, grads, want_bias: bool):
    """Fill grads = (dq, dk, dv) (see `_gradient_buffers`); return the bias's gradient (in the
    accumulation dtype) when `want_bias`, else None."""
    rows, band, segments, prefix_p, dropout = (
        setup.rows, setup.band, setup.segments, setup.prefix, setup.dropout
    )  # fmt: skip
    dq, dk, dv = grads
    acc = dq.dtype
    dbias = torch.zeros(bias.shape, dtype=acc, device=q.device) if want_bias else None
    # (the kernel gives no score gradient, and takes no keep mask)
    fused = kernel_runs(q, v) and not want_bias and dropout is None
    if _tile_rows(setup):
        grad_out = grad_out.contiguous()
    # (the fast paths read grad_out in slices, copied by the kernel only where strided or
    # expanded: a whole contiguous copy is a fresh T-long buffer whose first touch costs
    # page faults. Measured, fwd + bwd at T 4096: ~4800 -> ~800 minor faults a window
    # step; module documents 336 -> 328 ms, prefix 822 -> 812 ms)
    # (B, H, Tq): rowsum(dO * O), which the plain tiles need (the kernel finds its own)
    delta = None if fused else (grad_out.to(acc) * out.to(acc)).sum(dim=-1)
    if band is not None or segments is not None or prefix_p is not None:
        _fast_backward(setup, q, k, v, grad_out, out, lse, dq, dk, dv)
    if setup.masked is not None:
        _masked_backward(setup.masked, setup.scale, q, k, v, grad_out, out, lse, dq, dk, dv)
    if setup.intervals is not None:
        B, H, T = lse.shape
        iv = setup.intervals
        lo, hi = iv.lo.expand(B, H, T), iv.hi.expand(B, H, T)
        pairs = iv.pairs(B, H)
        interval_backward(q, k, v, grad_out, out, lse, lo, hi, setup.scale, dq, dk, dv, pairs)
    if rows:
        _plan_backward(setup, q, k, v, mask, bias, out, lse, grad_out, delta, grads, dbias, fused)
    return dbias


def _plan_backward(setup, q, k, v, mask, bias, out, lse, grad_out, delta, grads, dbias, fused):
    """The general plan, backward: units of consecutive query blocks on worker threads. A
    unit's rows of dq are its own; the key gradients (and the bias's) gather from every row,
    so each unit after the first adds into zeros of its own (made on its worker), summed
    into them at the end by units of kv heads (so no fill or add runs in the calling thread,
    where each is a parallel region: measured beside a busy process, window 256 as a
    mask_mod at T 4096, two threads, ~100 ms of fills and ~170 ms of adds there)."""
    rows = setup.rows
    n = workers(q, k, v, mask, bias, grad_out, out, grads[0])
    groups = row_groups([_weight(tiles) for _, tiles in rows], n)
    dq, dk, dv = grads
    own: list[tuple | None] = [(dk, dv, dbias)] + [None] * (len(groups) - 1)
    args = (setup, q, k, v, mask, bias, out, lse, grad_out, delta, fused)

    def unit(j: int) -> None:
        if own[j] is None:
            own[j] = (torch.zeros_like(dk), torch.zeros_like(dv), _zeros_like(dbias))
        _plan_rows_backward(*args, [rows[i] for i in groups[j]], dq, *own[j])  # type: ignore[misc]

    run([functools.partial(unit, j) for j in range(len(groups))], n)
    if len(groups) == 1:
        return
    parts = [t for t in own[1:] if t is not None]

    def gather(h: slice) -> None:  # kv heads h of dk and dv (and the bias's heads)
        for dk_u, dv_u, dbias_u in parts:
            dk[:, h] += dk_u[:, h]
            dv[:, h] += dv_u[:, h]
            if dbias is not None and dbias_u is not None:
                if dbias.shape[1] == 1:  # (one head: the first unit adds it whole)
                    if h.start == 0:
                        dbias.add_(dbias_u)
                else:
                    hb = slice(h.start * dbias.shape[1] // dk.shape[1],
                               h.stop * dbias.shape[1] // dk.shape[1])  # fmt: skip
                    dbias[:, hb] += dbias_u[:, hb]

    Hkv = dk.shape[1]
    step = max(1, -(-Hkv // (2 * n)))
    run([functools.partial(gather, slice(h, min(Hkv, h + step))) for h in range(0, Hkv, step)], n)


def _zeros_like(t: Tensor | None) -> Tensor | None:
    return None if t is None else torch.zeros_like(t)


def _plan_rows_backward(
    setup: _Setup, q, k, v, mask, bias, out, lse, grad_out, delta, fused, rows, dq, dk, dv, dbias
) -> None:
    """Plan rows (query block index, its tiles): their rows of dq, and what they add to dk,
    dv and the bias's gradient."""
    scale, dropout = setup.scale, setup.dropout
    tk = k.shape[2]
    want_bias = dbias is not None
    block = setup.block
    for span_run in runs(rows, setup.spans, block_rows(block)):
        allowed = _span_mask(setup, span_run, q, tk)
        run_backward(span_run, allowed, q, k, v, grad_out, out, lse, scale, dq, dk, dv)
    tiled_rows = (tiles for i, tiles in rows if setup.spans[i] is None)
    for tile in (tile for tiles in tiled_rows for tile in tiles):
        allowed, bias_t, diagonal = _tile_masks(tile, mask, bias, setup, q, tk, fused)
        r, c = slice(tile.q0, tile.q1), slice(tile.k0, tile.k1)
        ds: list[Tensor] | None = [] if want_bias else None
        if fused:
            dq_t, dk_t, dv_t = kernel_backward(
                q[:, :, r], k[:, :, c], v[:, :, c], grad_out[:, :, r], out[:, :, r],
                lse[:, :, r], allowed, bias_t, scale, diagonal,
            )  # fmt: skip
            dq[:, :, r] += dq_t
            dk[:, :, c] += dk_t
            dv[:, :, c] += dv_t
            continue
        assert delta is not None
        dq_t, dk_t, dv_t = tile_backward(
            q[:, :, r], k[:, :, c], v[:, :, c], grad_out[:, :, r], lse[:, :, r],
            delta[:, :, r], scale=scale, allowed=allowed, bias=bias_t,
            keep=_keep(tile, dropout, q.shape[0], q.shape[1], tk - q.shape[2], q.device),
            dropout_p=0.0 if dropout is None else dropout[0], bias_grad=ds,
        )  # fmt: skip
        dq[:, :, r] += dq_t
        dk[:, :, c] += dk_t
        dv[:, :, c] += dv_t
        if dbias is not None and ds:
            _add_bias_grad(dbias, ds[0], bias, tile)


class _Tiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, bias, docs, prefix_t, setup):
        out, lse = _forward(q, k, v, mask, bias, setup)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, mask, bias, docs, prefix_t, out, lse)
        ctx.setup = setup
        ctx.mark_non_differentiable(*[t for t in (mask, docs, prefix_t) if t is not None])
        return out

    @staticmethod
    @first_order("the tiled backend")
    def backward(ctx, grad_out):
        q, k, v, mask, bias, _, _, out, lse = ctx.saved_tensors
        acc = accumulation_dtype(q.dtype)
        dq, dk, dv, _ = _gradient_buffers(q, k, v, ctx.setup, acc, None)
        want_bias = bias is not None and ctx.needs_input_grad[4]
        dbias = _backward(
            q, k, v, mask, bias, out, lse, grad_out, ctx.setup, (dq, dk, dv), want_bias
        )
        grad_bias = None if dbias is None else dbias.to(bias.dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, grad_bias, None, None, None


class _TiledPacked(torch.autograd.Function):
    """`_Tiled` over q, k, v that are column views of one fused projection (see
    tile_packed.py): its input is the projection, its gradient one buffer that the backward
    writes dq, dk and dv into."""

    @staticmethod
    def forward(ctx, base, mask, bias, docs, prefix_t, setup, packed):
        q, k, v = take_views(base, packed.views)
        out, lse = _forward(q, k, v, mask, bias, setup)
        out = out.to(q.dtype)
        ctx.save_for_backward(base, mask, bias, docs, prefix_t, out, lse)
        ctx.setup, ctx.views, ctx.covers = setup, packed.views, packed.covers
        ctx.mark_non_differentiable(*[t for t in (mask, docs, prefix_t) if t is not None])
        return out

    @staticmethod
    @first_order("the tiled backend")
    def backward(ctx, grad_out):
        base, mask, bias, _, _, out, lse = ctx.saved_tensors
        q, k, v = take_views(base, ctx.views)
        packed = PackedViews(base, ctx.views, ctx.covers)
        dq, dk, dv, grad_base = _gradient_buffers(q, k, v, ctx.setup, base.dtype, packed)
        want_bias = bias is not None and ctx.needs_input_grad[2]
        dbias = _backward(
            q, k, v, mask, bias, out, lse, grad_out, ctx.setup, (dq, dk, dv), want_bias
        )
        grad_bias = None if dbias is None else dbias.to(bias.dtype)
        return grad_base, None, grad_bias, None, None, None, None
