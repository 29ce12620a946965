"""Which tiles of a structured attention call hold an allowed pair: the plan the tiled backend
follows. Decided from Python ints (shapes, the window, an int prefix) and, where reading them
is free (eager mode, CPU), from per-block ranges of the document ids; elsewhere documents only
make tiles partial, never skipped, so the plan stays correct under tracing.

A query block of `block` rows visits runs of key blocks; adjacent full blocks (every pair
allowed: no mask needed) merge into one span (up to a cap on the scores buffer). A `diagonal`
tile is square on the query positions and cut only by causality (a fused kernel runs it
causal, without a mask); any other is partial (a small (rows, keys) mask is built for it).
A further rule (`kind`: a mask_mod's tiles, see `functional.mask_mod`) can skip a tile or make
it partial; tiles are then `block` = (queries, keys), not necessarily square.

Shapes: documents (B, Tk); a tile is queries q0..q1 x keys k0..k1 of a (Tq, Tk) call.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from ..value_checks import may_read
from .structure import Structure

NONE, PARTIAL, FULL = 0, 1, 2
SPAN_ELEMENTS = 2**22  # scores per span (B x H x rows x keys): 16 MB in fp32


class Tile(NamedTuple):
    q0: int
    q1: int
    k0: int
    k1: int
    full: bool  # every (query, key) pair allowed (causality, structure, mask_mod): no mask
    diagonal: bool = False  # square on the query positions, cut by causality alone
    mod: bool = False  # the call's mask_mod cuts it: evaluate it on this tile when it runs


def block_size(structure: Structure | None) -> int:
    """Queries (and keys) per tile: 128, smaller for windows narrower than that (a window of
    W visits about W + block keys per query; smaller tiles cost more calls per pair)."""
    if structure is None or structure.window is None:
        return 128
    width = structure.window[0] + 1
    size = 128
    while size > 32 and size > width:
        size //= 2
    return size


def block_rows(block: int | tuple[int, int]) -> int:
    """Query rows per tile of a plan's `block` (an int: square; else (queries, keys))."""
    return block if isinstance(block, int) else block[0]


def _document_map(documents: Tensor, offset: int, tq: int, tk: int, bq: int, bk: int):
    """(query block, key block) -> NONE / PARTIAL / FULL from the blocks' id ranges, over the
    whole batch; None where reading ids is not free (then every tile is at most PARTIAL)."""
    if not may_read(documents):
        return None

    def ranges(ids: Tensor, block: int) -> tuple[Tensor, Tensor]:
        """(B, n) ids -> per block min and max, (B, blocks) each."""
        n = ids.shape[1]
        pad = (-n) % block
        if pad:  # repeat the last id: the padded rows never change a block's range
            ids = torch.cat([ids, ids[:, -1:].expand(-1, pad)], dim=1)
        blocks = ids.view(ids.shape[0], -1, block)
        return blocks.amin(dim=2), blocks.amax(dim=2)

    qmin, qmax = ranges(documents[:, offset : offset + tq], bq)
    kmin, kmax = ranges(documents, bk)
    qmin, qmax, kmin, kmax = qmin[:, :, None], qmax[:, :, None], kmin[:, None], kmax[:, None]
    apart = ((qmax < kmin) | (kmax < qmin)).all(dim=0)  # (nq, nk): no shared id in any row
    one = ((qmin == qmax) & (kmin == kmax) & (qmin == kmin)).all(dim=0)
    return (torch.where(apart, NONE, torch.where(one, FULL, PARTIAL))).tolist()


class TileRule(Protocol):
    """A further rule on the tiles the structure lets through (`mask_mod.TileClassifier`)."""

    def row(self, q0: int, q1: int, keys: list[tuple[int, int]]) -> list[int]:
        """NONE / PARTIAL / FULL of query rows q0..q1's tiles, keys their (k0, k1) in order."""
        ...


def plan_tiles(
    structure: Structure | None,
    causal: bool,
    batch: int,
    heads: int,
    tq: int,
    tk: int,
    block: int | tuple[int, int],
    kind: TileRule | None = None,
    blocks: range | None = None,
) -> list[list[Tile]]:
    """Per query block, the key spans it must visit (an empty list: the rows attend to nothing).

    `block`: rows and keys per tile (an int: square). `kind`: a further rule on each tile the
    structure lets through (a mask_mod's: `kind.row` gives one query block's tiles NONE /
    PARTIAL / FULL). `blocks`: plan only these query blocks (their rows, in order; default
    all)."""
    bq, bk = (block, block) if isinstance(block, int) else block
    s = structure if structure is not None else Structure()
    offset = tk - tq
    prefix = s.prefix
    prefix_int = prefix if isinstance(prefix, int) else None
    prefix_unknown = isinstance(prefix, Tensor)
    docs = None if s.documents is None else _document_map(s.documents, offset, tq, tk, bq, bk)
    cap = max(bk, (SPAN_ELEMENTS // max(batch * heads * bq, 1)) // bk * bk)
    rows: list[list[Tile]] = []
    for qi in range(-(-tq // bq)) if blocks is None else blocks:
        q0 = qi * bq
        q1 = min(q0 + bq, tq)
        p0, p1 = q0 + offset, q1 - 1 + offset  # first and last query positions
        kinds = []
        lo, hi = 0, tk  # the keys any query of this block may see (Python ints)
        if s.window is not None:
            lo, hi = max(0, p0 - s.window[0]), min(tk, p1 + s.window[1] + 1)
        if causal and prefix is None:
            hi = min(hi, p1 + 1)
        for ki in range(lo // bk, -(-hi // bk)):
            k0 = ki * bk
            k1 = min(k0 + bk, tk)
            j0, j1 = k0, k1 - 1
            full, none = True, False
            if causal:
                pre_full = prefix_int is not None and p1 < prefix_int and j1 < prefix_int
                pre_none = not prefix_unknown and (
                    prefix_int is None or p0 >= prefix_int or j0 >= prefix_int
                )
                full = j1 <= p0 or pre_full
                none = j0 > p1 and pre_none
            if s.window is not None:
                left, right = s.window
                full = full and j0 >= p1 - left and j1 <= p0 + right
                none = none or j1 < p0 - left or j0 > p1 + right
            if docs is not None:
                full = full and docs[qi][ki] == FULL
                none = none or docs[qi][ki] == NONE
            if none:
                continue
            # Square on the positions, and everything but causality allows every pair:
            diagonal = causal and not full and k0 == p0 and k1 - 1 == p1 and prefix is None
            if diagonal and s.window is not None:
                diagonal = p1 - p0 <= s.window[0]
            if diagonal and docs is not None:
                diagonal = docs[qi][ki] == FULL
            elif diagonal and s.documents is not None:
                diagonal = False
            kinds.append(Tile(q0, q1, k0, k1, full, diagonal))
        if kind is not None:
            kinds = _apply(kind, q0, q1, kinds)
        rows.append(_merge(kinds, cap))
    return rows


def _apply(kind: TileRule, q0: int, q1: int, tiles: list[Tile]) -> list[Tile]:
    """The structure's tiles of one query block after the further rule: NONE dropped, PARTIAL
    marked `mod` (neither full nor diagonal then)."""
    extras = kind.row(q0, q1, [(t.k0, t.k1) for t in tiles])
    return [
        t._replace(full=False, diagonal=False, mod=True) if extra == PARTIAL else t
        for t, extra in zip(tiles, extras, strict=True)
        if extra != NONE
    ]


def _merge(tiles: list[Tile], cap: int) -> list[Tile]:
    """Adjacent full tiles -> spans of at most `cap` keys; partial and diagonal tiles stay
    apart (their masks, or the kernel's causality, cover their own keys only)."""
    spans: list[Tile] = []
    for tile in tiles:
        last = spans[-1] if spans else None
        if (
            last is not None
            and last.full
            and tile.full
            and last.k1 == tile.k0
            and tile.k1 - last.k0 <= cap
        ):
            spans[-1] = last._replace(k1=tile.k1)
        else:
            spans.append(tile)
    return spans
