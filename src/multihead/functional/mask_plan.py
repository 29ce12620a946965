"""`block_mask(mask_mod, B, H, Q_LEN, KV_LEN)`: a mask function with its tiles classified
once, held by the caller and passed as `mask_mod=` to many calls (FlexAttention's
`create_block_mask` / `BlockMask`, for multihead's tiled backend).

A `mask_mod` passed alone is classified on every call: the tiled backend evaluates it on
each tile the call's structure lets through and reads which tiles are all False (skipped),
all True (run without a mask) or partial (run under the evaluated block). That is the
function's own element work on every pair (measured, a window of 256 as a mask function at
T 4096: ~40 ms of CPU a call, about a third of the call). A `MaskPlan` does it once, on the
whole (Q_LEN, KV_LEN) grid, and keeps the result ON ITSELF: each tile's kind, the partial
tiles' boolean masks (up to `mask_mod.CACHE_ELEMENTS` booleans; the others are evaluated
when they run), and whether the mask is exactly a causal window (then the tiled backend runs
the window's band fast path, `tile_band.py`, as for `window=`). Nothing is cached anywhere
else: drop the plan and its memory goes with it.

A plan is itself a mask function (calling it calls `mask_mod`), so it goes wherever a
`mask_mod` does (`attention()`, `MultiHeadAttention.forward`, every backend: those that do
not read structure evaluate it on the dense grid as before). A call it is given to must
match it: Tq == Q_LEN, Tk == KV_LEN, the batch size B and query heads H unless the plan was
built with None there (then the function must not depend on b / h: it was evaluated for one
row / head, as flex's B=None / H=None), and `block_size` (if given) its tile: a ValueError
otherwise.

Shapes: a plan of Q_LEN x KV_LEN in tiles of (bq, bk); kinds (ceil(Q_LEN / bq), ceil(KV_LEN /
bk)); a partial tile's mask (B or 1, H or 1, rows, keys).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

from ..value_checks import may_read
from .mask_documents import documents_of
from .mask_mod import DEFAULT_BLOCK, TileClassifier, check_block_size
from .structure import MaskMod, Structure, structure_mask
from .tile_plan import FULL, NONE, PARTIAL, Tile, plan_tiles

T_ = TypeVar("T_")


def _dim(name: str, value: object, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        also = " or None (any, the function ignoring it)" if allow_none else ""
        raise ValueError(f"{name} must be a positive int{also}, got {value!r}")
    return int(value)


class MaskPlan:
    """A `mask_mod` with its tile classification held (see the module docstring); made by
    `block_mask`. Call it as the mask function it wraps."""

    def __init__(
        self,
        mask_mod: MaskMod,
        batch: int | None,
        heads: int | None,
        q_len: int,
        kv_len: int,
        block: tuple[int, int],
        device: torch.device,
        kinds: list[list[int]] | None,
        masks: dict[tuple[int, int, int, int], Tensor],
    ):
        self.mask_mod = mask_mod
        self.batch, self.heads = batch, heads
        self.q_len, self.kv_len = q_len, kv_len
        self.block = block
        self.device = device
        self.kinds = kinds  # None: not read (built where reading values is not free)
        self.masks = masks
        self.window = None if kinds is None else _causal_window(self)
        # the document ids (B or 1, T) when the mask is exactly causal documents in
        # contiguous runs (`mask_documents`): the tiled backend runs `documents=`'s fast path
        self.documents = (
            None
            if kinds is None or self.window is not None
            else documents_of(kinds, masks, block, q_len, kv_len)
        )
        # the tiled backend's assembled span masks, per (causal, dtype): made by its first
        # call's forward, read by every later call (see `span_cache`)
        self._span_caches: dict[tuple[bool, torch.dtype], object] = {}
        self._causal_documents: list[Tensor | None] = []  # (made on first use: see documents_for)
        self._held: dict[object, object] = {}  # (made on first use: see held)
        self._lock = threading.Lock()

    def __call__(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return self.mask_mod(b, h, q_idx, kv_idx)

    def __repr__(self) -> str:
        b = "None" if self.batch is None else self.batch
        h = "None" if self.heads is None else self.heads
        if self.kinds is None:
            what = "not classified"
        else:
            flat = [k for row in self.kinds for k in row]
            what = (
                f"{flat.count(FULL)} full, {flat.count(PARTIAL)} partial, "
                f"{flat.count(NONE)} empty tiles"
            )
            if self.window is not None:
                what += f"; a causal window of {self.window + 1}"
            if self.documents is not None:
                what += f"; causal documents ({int(self.documents[0].max()) + 1} in row 0)"
        return (
            f"MaskPlan(B={b}, H={h}, Q_LEN={self.q_len}, KV_LEN={self.kv_len}, "
            f"block_size={self.block}: {what})"
        )

    # (the tile_plan.TileRule protocol, and what the tiled backend reads of a classifier)
    @property
    def readable(self) -> bool:
        return self.kinds is not None

    def row(self, q0: int, q1: int, keys: list[tuple[int, int]]) -> list[int]:
        """The held kinds of query rows q0..q1's tiles (keys: their (k0, k1), on the grid)."""
        if self.kinds is None:
            return [PARTIAL] * len(keys)
        kinds = self.kinds[q0 // self.block[0]]
        return [kinds[k0 // self.block[1]] for k0, _ in keys]

    def span_cache(self, key: tuple[bool, torch.dtype]):
        """The tiled backend's cache of this plan's span masks for calls of `key` = (causal,
        dtype) with no other structure (`backends.tile_spans.SpanCache`), made on first use;
        it lives, and its memory goes, with the plan."""
        from .backends.tile_spans import SpanCache  # (below us in the package)

        with self._lock:
            cache = self._span_caches.get(key)
            if cache is None:
                cache = self._span_caches[key] = SpanCache()
            return cache

    def held(self, key: object, build: Callable[[], T_]) -> T_:
        """What the tiled backend derives from this plan alone under `key` (e.g. the masked
        band of its causal calls, `backends.tile_masked_band`): build() on first use, kept
        here, so it lives, and its memory goes, with the plan."""
        with self._lock:
            if key in self._held:
                return self._held[key]  # type: ignore[return-value]
        value = build()  # (outside the lock: two threads may both build; one is kept)
        with self._lock:
            return self._held.setdefault(key, value)  # type: ignore[return-value]

    def documents_for(self, causal: bool) -> Tensor | None:
        """The document ids (B or 1, T) of a call's mask (this plan's, and causality where
        `causal`) when it is exactly causal documents in contiguous runs, else None. A causal
        call of a plan whose own mask is not causal (documents as `ids[q] == ids[k]`) reads
        its tiles with causality cut in, once, on first use; the answer stays on the plan."""
        if self.documents is not None or not causal or self.kinds is None:
            return self.documents
        with self._lock:
            if not self._causal_documents:
                b, h, tq, tk = self.batch or 1, self.heads or 1, self.q_len, self.kv_len
                rows = plan_tiles(None, True, b, h, tq, tk, self.block, self)
                found = documents_of_rows(rows, self.masks, True, self.block, tq, tk)
                self._causal_documents.append(found)
            return self._causal_documents[0]

    def serves(self, device: torch.device) -> bool:
        """Whether its classification serves a call on `device` (evaluated there)."""
        return self.kinds is not None and device == self.device

    def check(
        self, batch: int | None, heads: int | None, tq: int, tk: int, block_size: object
    ) -> None:
        """A ValueError unless a call of q (batch, heads, tq, D), tk keys and `block_size`
        (None: the plan's) matches the plan."""
        want = (self.batch, self.heads, self.q_len, self.kv_len)
        got = (batch, heads, tq, tk)
        names = ("B", "H", "Q_LEN", "KV_LEN")
        wrong = [
            f"{n}={w} but the call has {g}"
            for n, w, g in zip(names, want, got, strict=True)
            if w is not None and g is not None and w != g
        ]
        if block_size is not None and check_block_size(block_size) != self.block:
            wrong.append(f"block_size={self.block} but the call asks for {block_size!r}")
        if wrong:
            raise ValueError(
                "mask_mod is a MaskPlan built for another call: "
                + "; ".join(wrong)
                + " (build one with block_mask(mask_mod, B, H, Q_LEN, KV_LEN) for these "
                "shapes; B=None / H=None serve any batch size / head count)"
            )


def block_mask(
    mask_mod: MaskMod,
    B: int | None,
    H: int | None,
    Q_LEN: int,
    KV_LEN: int,
    *,
    block_size: int | tuple[int, int] | None = None,
    device: torch.device | str = "cpu",
) -> MaskPlan:
    """Classify `mask_mod` (see `functional.mask_mod`) once over a (Q_LEN, KV_LEN) call in
    tiles of `block_size` (an int or a (queries, keys) pair; default 128, a shorter last tile
    where it does not divide), for a batch of B rows and H query heads (None: the function
    ignores b / h and the plan serves any), evaluated on `device`. Pass the result as
    `mask_mod=` to every call of those shapes: the tiled backend then reads the held
    classification instead of evaluating the function again (as flex_attention's BlockMask).

    Example::

        plan = block_mask(lambda b, h, q, k: (k <= q) & (q - k < 256), None, None, T, T)
        out = attention(q, k, v, mask_mod=plan)          # any number of calls, one build
    """
    if not callable(mask_mod):
        raise TypeError(
            "mask_mod must be a function mask_mod(b, h, q_idx, kv_idx) -> boolean tensor, got "
            f"{type(mask_mod).__name__}"
        )
    if isinstance(mask_mod, MaskPlan):
        mask_mod = mask_mod.mask_mod
    batch, heads = _dim("B", B, True), _dim("H", H, True)
    tq, tk = _dim("Q_LEN", Q_LEN, False), _dim("KV_LEN", KV_LEN, False)
    assert tq is not None and tk is not None
    block = (DEFAULT_BLOCK, DEFAULT_BLOCK) if block_size is None else check_block_size(block_size)
    if block_size is not None and (tq % block[0] or tk % block[1]):
        raise ValueError(
            f"block_size {block_size!r} (queries {block[0]}, keys {block[1]}) must divide "
            f"Q_LEN={tq} and KV_LEN={tk}"
        )
    dev = torch.device(device)
    probe = torch.zeros(1, device=dev)
    if not may_read(probe):  # (tracing, or a device where reading values costs a sync)
        return MaskPlan(mask_mod, batch, heads, tq, tk, block, dev, None, {})
    classifier = TileClassifier(mask_mod, batch or 1, heads or 1, tq, tk, dev, True)
    nq, nk = -(-tq // block[0]), -(-tk // block[1])
    keys = [(ki * block[1], min((ki + 1) * block[1], tk)) for ki in range(nk)]
    kinds: list[list[int]] = [[] for _ in range(nq)]

    def classify(rows: range) -> None:
        for qi in rows:
            q0 = qi * block[0]
            kinds[qi] = classifier.row(q0, min(q0 + block[0], tq), keys)

    with torch.no_grad():
        _run_rows(classify, nq, dev)
    return MaskPlan(mask_mod, batch, heads, tq, tk, block, dev, kinds, classifier.masks)


def _run_rows(classify, count: int, device: torch.device) -> None:
    """classify(range of query blocks) over all `count`, in units on the tiled backend's
    workers where the device is the CPU (each unit's evaluations single-threaded: see
    `backends.tile_threads`), else inline."""
    from .backends.tile_threads import row_groups, run, workers  # (below us in the package)

    n = workers() if device.type == "cpu" else 1
    groups = row_groups([1] * count, n)
    run([functools.partial(classify, g) for g in groups], n)


def _causal_window(plan: MaskPlan) -> int | None:
    """The held plan's causal window (see `causal_window`)."""
    assert plan.kinds is not None
    return causal_window(plan.kinds, plan.masks, plan.block, plan.q_len, plan.kv_len)


def causal_window(
    kinds: list[list[int]],
    masks: dict[tuple[int, int, int, int], Tensor],
    block: tuple[int, int],
    tq: int,
    tk: int,
) -> int | None:
    """L when a classified (tq, tk) grid in tiles of `block` (kinds per query block and key
    block; the partial tiles' masks by (q0, q1, k0, k1)) is exactly the causal window of
    L + 1 keys (query at position p sees keys p - L .. p, for every batch row and head);
    None otherwise, or where a partial tile's mask was not kept."""
    (bq, bk), offset = block, tk - tq
    # L from the last query's row: its allowed keys are p - L .. p
    qi = (tq - 1) // bq
    q0, q1 = qi * bq, min(qi * bq + bq, tq)
    count = 0
    for ki, kind in enumerate(kinds[qi]):
        k0, k1 = ki * bk, min(ki * bk + bk, tk)
        if kind == FULL:
            count += k1 - k0
        elif kind == PARTIAL:
            mask = masks.get((q0, q1, k0, k1))
            if mask is None:
                return None
            count += int(mask[0, 0, -1].sum())
    left = count - 1
    if left < 0:
        return None
    window = Structure(window=(left, 0))
    exact: dict[tuple[int, int, int], Tensor] = {}  # by (position - key, rows, keys): repeats
    for qi, row in enumerate(kinds):
        q0, q1 = qi * bq, min(qi * bq + bq, tq)
        p0, p1 = q0 + offset, q1 - 1 + offset
        for ki, kind in enumerate(row):
            k0, k1 = ki * bk, min(ki * bk + bk, tk)
            j0, j1 = k0, k1 - 1
            if j0 > p1 or j1 < p0 - left:
                want = NONE
            elif j1 <= p0 and j0 >= p1 - left:
                want = FULL
            else:
                want = PARTIAL
            if kind != want:
                return None
            if kind == PARTIAL:
                mask = masks.get((q0, q1, k0, k1))
                if mask is None:
                    return None
                shape = (p0 - k0, q1 - q0, k1 - k0)
                if shape not in exact:
                    tile = structure_mask(window, True, q0, q1, k0, k1, tq, tk, mask.device)
                    assert tile is not None
                    exact[shape] = tile
                if not torch.equal(*torch.broadcast_tensors(mask, exact[shape])):
                    return None
    return left


def documents_of_rows(
    rows: list[list[Tile]],
    masks: dict[tuple[int, int, int, int], Tensor],
    causal: bool,
    block: tuple[int, int],
    tq: int,
    tk: int,
) -> Tensor | None:
    """`mask_documents.documents_of` of a call's plan rows (`grid_of_rows`): the ids
    (B or 1, T) when the call's mask is exactly causal documents in contiguous runs."""
    grid = grid_of_rows(rows, masks, causal, block, tq, tk)
    return None if grid is None else documents_of(*grid, block, tq, tk)


def grid_of_rows(
    rows: list[list[Tile]],
    masks: dict[tuple[int, int, int, int], Tensor],
    causal: bool,
    block: tuple[int, int],
    tq: int,
    tk: int,
) -> tuple[list[list[int]], dict[tuple[int, int, int, int], Tensor]] | None:
    """A call's plan rows as a classified grid: the kinds of every tile (NONE where the
    plan skips it) and the partial tiles' masks with causality cut in; None where a tile
    the mask_mod cuts has no kept mask."""
    bq, bk = block
    kinds = [[NONE] * -(-tk // bk) for _ in range(-(-tq // bq))]
    cut: dict[tuple[int, int, int, int], Tensor] = {}
    free, offset = Structure(), tk - tq
    causality: dict[tuple[int, int, int], Tensor | None] = {}  # by (position - key, rows, keys)
    for qi, tiles in enumerate(rows):
        for t in tiles:
            if t.full:  # (adjacent full tiles are merged: every key block of it)
                for ki in range(t.k0 // bk, -(-t.k1 // bk)):
                    kinds[qi][ki] = FULL
                continue
            key = (t.q0, t.q1, t.k0, t.k1)
            shape = (t.q0 + offset - t.k0, t.q1 - t.q0, t.k1 - t.k0)
            if shape not in causality:
                causality[shape] = structure_mask(free, causal, *key, tq, tk, torch.device("cpu"))
            allowed = causality[shape]
            if t.mod:
                own = masks.get(key)
                if own is None:
                    return None
                allowed = own if allowed is None else allowed & own
            if allowed is None:
                kinds[qi][t.k0 // bk] = FULL
            else:
                kinds[qi][t.k0 // bk] = PARTIAL
                cut[key] = allowed
    return kinds, cut
