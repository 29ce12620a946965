"""Recognising a classified mask function as causal documents: `documents_of(kinds, masks,
...)` gives the document ids (B or 1, T) when a square (T, T) grid, classified in tiles
(`mask_plan.block_mask`'s held kinds, or a call's plan rows cut by causality), is EXACTLY the
block-diagonal causal mask of documents in contiguous runs (query p sees keys start(p) .. p,
start(p) the first position of p's document), for every batch row and head; None otherwise.
The tiled backend then runs the `documents=` fast path (`backends.tile_segments`) on them.

How: each row's first allowed key is read from the tiles (the first full tile, or the first
True of the first partial tile holding one), which must be a valid partition (0 at the first
row; each row's start its own position or the row before's). The ids follow; then every tile
is checked against them: its kind (NONE / PARTIAL / FULL over all batch rows and heads) and
each partial tile's mask, pair by pair, all heads. A near miss (one key, one tile, one head,
a gap, a row with no key, keys past the diagonal) returns None.

Shapes: kinds (query blocks, key blocks); masks by (q0, q1, k0, k1), each (B or 1, H or 1,
rows, keys); ids (B or 1, T), long.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .tile_plan import FULL, NONE, PARTIAL


def documents_of(
    kinds: list[list[int]],
    masks: dict[tuple[int, int, int, int], Tensor],
    block: tuple[int, int],
    tq: int,
    tk: int,
) -> Tensor | None:
    """The document ids (B or 1, T) when the classified grid is exactly causal documents in
    contiguous runs (see the module docstring); None otherwise or where a partial tile's
    mask was not kept."""
    if tq != tk or not kinds:
        return None
    (bq, bk), T = block, tq
    batch = max((m.shape[0] for m in masks.values()), default=1)
    starts = _first_keys(kinds, masks, bq, bk, T, batch)
    if starts is None:
        return None
    pos = torch.arange(T)
    new = starts == pos  # (B, T): a document starts here
    valid = bool(new[:, 0].all()) and bool(((starts[:, 1:] == starts[:, :-1]) | new[:, 1:]).all())
    if not valid:
        return None
    if not _tiles_match(kinds, masks, starts, bq, bk, T):
        return None
    return new.long().cumsum(dim=1) - 1


def _first_keys(kinds, masks, bq: int, bk: int, T: int, batch: int) -> Tensor | None:
    """(B, T): each row's first allowed key, read from its block's tiles in key order; None
    where a row allows nothing (a document row always sees itself) or a mask is missing."""
    starts = torch.full((batch, T), -1, dtype=torch.long)
    for qi, row in enumerate(kinds):
        q0, q1 = qi * bq, min(qi * bq + bq, T)
        found = starts[:, q0:q1]  # (B, rows), a view
        for ki, kind in enumerate(row):
            if kind == NONE:
                continue
            k0, k1 = ki * bk, min(ki * bk + bk, T)
            if kind == FULL:
                found.masked_fill_(found < 0, k0)
                break
            mask = masks.get((q0, q1, k0, k1))
            if mask is None:
                return None
            m = mask.cpu()[:, 0].expand(batch, -1, -1)  # (B, rows, keys): head 0 (all: later)
            first = k0 + m.to(torch.uint8).argmax(dim=2)
            take = (found < 0) & m.any(dim=2)
            found.copy_(torch.where(take, first, found))
            if bool((found >= 0).all()):
                break
        if bool((found < 0).any()):
            return None
    return starts


def _tiles_match(kinds, masks, starts: Tensor, bq: int, bk: int, T: int) -> bool:
    """Every tile's kind, and every partial tile's mask, as the documents of `starts` make
    them (row p sees keys starts[p] .. p; starts nondecreasing)."""
    nq, nk = len(kinds), len(kinds[0])
    q0 = torch.arange(nq) * bq  # (nq,)
    q1 = (q0 + bq).clamp(max=T)
    k0 = torch.arange(nk) * bk  # (nk,)
    k1 = (k0 + bk).clamp(max=T)
    # per batch row: full when every row sees every key of the tile, none when no row sees one
    last_start = starts[:, q1 - 1][:, :, None]  # (B, nq, 1): the block's largest start
    full = (last_start <= k0) & (q0[:, None] >= k1 - 1)  # (B, nq, nk)
    first = torch.maximum(q0[:, None], k0[None, :])  # (nq, nk): the first row at or past k0
    seen = starts[:, first.clamp(max=T - 1)]  # (B, nq, nk)
    none = (first >= q1[:, None]) | (seen >= k1)
    want = torch.full((nq, nk), PARTIAL, dtype=torch.long)
    want[full.all(dim=0)] = FULL
    want[none.all(dim=0)] = NONE
    if not torch.equal(torch.tensor(kinds, dtype=torch.long), want):
        return False
    for qi, ki in (want == PARTIAL).nonzero().tolist():
        r0, r1 = qi * bq, min(qi * bq + bq, T)
        c0, c1 = ki * bk, min(ki * bk + bk, T)
        mask = masks.get((r0, r1, c0, c1))
        if mask is None:
            return False
        keys = torch.arange(c0, c1)
        rows = torch.arange(r0, r1)[:, None]
        allowed = (keys >= starts[:, r0:r1, None]) & (keys <= rows)  # (B, rows, keys)
        if not torch.equal(*torch.broadcast_tensors(mask.cpu(), allowed[:, None])):
            return False
    return True
