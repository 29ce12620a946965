"""Which tiles a rank computes when it holds some block of keys: a static plan from global
positions alone (no tensor values), so the same plan serves the forward and the backward ring.

Each rank's queries and the key block it holds are lists of `Segment`s (see layout.py). They are
cut into tiles of at most `block_size` positions; under a causal mask a tile pair whose keys all
come after its queries is skipped, and one whose keys all come at or before its queries needs no
mask at all. Only tiles on the diagonal build a causal mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .layout import Segment


@dataclass(frozen=True)
class Tile:
    """A run of `length` positions: global `start ..`, local rows `offset ..` of its chunk."""

    start: int
    offset: int
    length: int

    @property
    def last(self) -> int:
        return self.start + self.length - 1


@dataclass(frozen=True)
class TilePair:
    queries: Tile
    keys: Tile
    diagonal: bool  # causal and straddling the diagonal: needs the key <= query mask


def tiles(segments: Sequence[Segment], block_size: int) -> list[Tile]:
    """Cut segments into tiles of at most `block_size` positions (tiles never span segments)."""
    out = []
    for seg in segments:
        for i in range(0, seg.length, block_size):
            n = min(block_size, seg.length - i)
            out.append(Tile(seg.start + i, seg.offset + i, n))
    return out


def tile_pairs(
    query_segments: Sequence[Segment],
    key_segments: Sequence[Segment],
    *,
    causal: bool,
    block_size: int,
) -> list[TilePair]:
    """The tile pairs to compute, in a fixed order; fully masked pairs are left out."""
    pairs = []
    key_tiles = tiles(key_segments, block_size)
    for qt in tiles(query_segments, block_size):
        for kt in key_tiles:
            if causal and kt.start > qt.last:
                continue  # every key comes after every query
            pairs.append(TilePair(qt, kt, diagonal=causal and kt.last > qt.start))
    return pairs


def work(pairs: Sequence[TilePair]) -> int:
    """Query-key entries a plan computes: the cost that zig-zag balances across ranks."""
    return sum(p.queries.length * p.keys.length for p in pairs)
