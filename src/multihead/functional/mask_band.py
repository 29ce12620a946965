"""A mask that lies inside a causal band, held as that band: `BandMask(left, allowed)` with
allowed[b, h, p, e] True when query p may attend key p - L + e (e in 0 .. L, L = `left`).

Every pair a causal window of L + 1 allows is in it; what the band adds is any pattern inside
the window: documents (a causal window within documents), a window with holes, a window
per head. The tiled backend runs such a mask as one batched kernel call over overlapping
key bands, each block under its own mask gathered from `allowed`
(`backends.tile_masked_band`), instead of the general tile plan.

Two sources, both exact:
- `band_of_grid`: a classified grid (a held plan's kinds and partial masks, or a call's plan
  rows cut by causality, as `mask_documents.documents_of` reads). L is the largest
  `p - key` of any allowed pair; any allowed pair with a key after its query (p - key < 0),
  a partial tile whose mask was not kept, or L above `max_left` refuses (None). The band is
  then written from the tiles themselves (a full tile's pairs True, a partial tile's mask
  pair by pair, every batch row and head), so it holds exactly the grid's pairs: nothing is
  assumed about the mask's shape beyond the band.
- `band_of_documents`: `window=` (causal) with `documents=` ids: key p - L + e allowed when
  it exists and has the query's id.

Shapes: allowed (B or 1, H or 1, T, L + 1) bool; kinds (query blocks, key blocks); masks by
(q0, q1, k0, k1), each (B or 1, H or 1, rows or 1, keys); ids (B, T).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .tile_plan import FULL, NONE


class BandMask(NamedTuple):
    left: int  # L: the farthest key back, p - L
    allowed: Tensor  # (B or 1, H or 1, T, L + 1): [.., p, e] the pair (p, p - L + e)


def band_of_grid(
    kinds: list[list[int]],
    masks: dict[tuple[int, int, int, int], Tensor],
    causal: bool,
    block: tuple[int, int],
    tq: int,
    tk: int,
    max_left: int,
) -> BandMask | None:
    """The band holding exactly a square grid's allowed pairs (causality cut in where
    `causal`), when every one lies within max_left keys before its query and none after it;
    None otherwise (see the module docstring)."""
    if tq != tk or not kinds:
        return None
    (bq, bk), T = block, tq
    tiles = []  # (q0, q1, k0, k1, mask or None: full)
    batch = heads = 1
    left = -1
    for qi, row in enumerate(kinds):
        q0, q1 = qi * bq, min(qi * bq + bq, T)
        for ki, kind in enumerate(row):
            if kind == NONE:
                continue
            k0, k1 = ki * bk, min(ki * bk + bk, T)
            mask = None
            if kind != FULL:
                mask = masks.get((q0, q1, k0, k1))
                if mask is None:
                    return None
                mask = mask.cpu().expand(-1, -1, q1 - q0, k1 - k0)
            d = torch.arange(q0, q1)[:, None] - torch.arange(k0, k1)[None, :]  # p - key
            if mask is None:
                if k1 - 1 > q0 and not causal:
                    return None  # a key after its query
                mask = (d >= 0)[None, None] if k1 - 1 > q0 else None
            elif causal:
                mask = mask & (d >= 0)
            elif bool((mask & (d < 0)).any()):
                return None
            if mask is None:
                far = q1 - 1 - k0
            else:
                seen = mask.any(dim=1).any(dim=0)  # (rows, keys): by any batch row or head
                if not bool(seen.any()):
                    continue
                far = int(d[seen].max())
                batch, heads = max(batch, mask.shape[0]), max(heads, mask.shape[1])
            left = max(left, far)
            if left > max_left:
                return None
            tiles.append((q0, q1, k0, k1, mask))
    if left < 0:
        return None
    # Written through a padded (B, H, T, W) buffer: tile row r, column c is band column
    # e = k0 + c - q0 - r + L, at offset `pad` (a tile holding an allowed pair reaches at most
    # bq + bk columns either side of the band); a skewed view writes a whole tile at once.
    pad = bq + bk
    W = left + 1 + 2 * pad
    buf = torch.zeros(batch, heads, T, W, dtype=torch.bool)
    st = buf.stride()
    for q0, q1, k0, k1, mask in tiles:
        view = buf.as_strided(
            (batch, heads, q1 - q0, k1 - k0),
            (st[0], st[1], W - 1, 1),
            q0 * W + k0 - q0 + left + pad,
        )
        if mask is None:
            view.fill_(True)
        else:
            view.copy_(mask.expand(batch, heads, -1, -1))
    if bool(buf[..., :pad].any()) or bool(buf[..., pad + left + 1 :].any()):
        return None  # (cannot happen: every pair written lies within L of its query)
    return BandMask(left, buf[..., pad : pad + left + 1].contiguous())


def band_of_documents(ids: Tensor, left: int) -> BandMask:
    """The band of a causal window of left + 1 keys within documents (ids (B, T)): key
    p - L + e allowed when it exists (p - L + e >= 0) and has p's id."""
    B, T = ids.shape
    pad = torch.zeros(B, left, dtype=ids.dtype, device=ids.device)
    keys = torch.cat([pad, ids], dim=1).unfold(1, left + 1, 1)  # (B, T, L + 1): keys p - L .. p
    same = keys == ids[:, :, None]
    e = torch.arange(left + 1, device=ids.device)
    exists = e[None, :] >= left - torch.arange(T, device=ids.device)[:, None]  # (T, L + 1)
    return BandMask(left, (same & exists)[:, None])
