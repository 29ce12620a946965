"""How a sequence of T positions is split across the P ranks of a ring.

- "contiguous": rank r holds one run of positions, r*T/P .. (r+1)*T/P - 1. When P does not
  divide T the first T % P ranks hold one position more (`torch.tensor_split`'s rule).
- "zigzag": the sequence is cut into 2P pieces (same rule); rank r holds piece r followed by
  piece 2P-1-r. Under a causal mask every rank then has about the same work: early queries see
  few keys, late ones many, and each rank holds one of each.

A rank's local chunk is its segments concatenated in order. Shapes: x (..., T, ...) along `dim`;
a chunk (..., T_r, ...), T_r = the rank's local length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Layout = Literal["contiguous", "zigzag"]
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag")


@dataclass(frozen=True)
class Segment:
    """Global positions `start .. stop - 1`, stored from `offset` on in the rank's local chunk."""

    start: int
    stop: int
    offset: int

    @property
    def length(self) -> int:
        return self.stop - self.start


def check_layout(layout: object) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return str(layout)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _pieces(seq_len: int, n: int) -> list[tuple[int, int]]:
    """(start, stop) of n consecutive pieces of seq_len positions; the first seq_len % n get one
    more (as torch.tensor_split)."""
    base, extra = divmod(seq_len, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _with_offsets(ranges: Sequence[tuple[int, int]]) -> list[Segment]:
    out, offset = [], 0
    for start, stop in ranges:
        out.append(Segment(start, stop, offset))
        offset += stop - start
    return out


def layout_segments(
    seq_len: int, world_size: int, layout: str = "contiguous"
) -> list[list[Segment]]:
    """The segments of every rank, `[rank][i]`, for a sequence of `seq_len` positions.

    Every segment must be non-empty: contiguous needs seq_len >= world_size, zigzag
    seq_len >= 2 * world_size.
    """
    layout = check_layout(layout)
    world_size = _check_int("world_size", world_size, 1)
    seq_len = _check_int("seq_len", seq_len, 0)
    n = world_size if layout == "contiguous" else 2 * world_size
    if seq_len < n:
        raise ValueError(
            f"a {layout} layout over {world_size} ranks needs at least {n} positions "
            f"(every piece non-empty), got seq_len={seq_len}"
        )
    pieces = _pieces(seq_len, n)
    if layout == "contiguous":
        return [_with_offsets([p]) for p in pieces]
    return [_with_offsets([pieces[r], pieces[n - 1 - r]]) for r in range(world_size)]


def segments_from_lengths(lengths: Sequence[int], layout: str) -> list[list[Segment]]:
    """Every rank's segments from every rank's local length (as the ring learns them).

    Contiguous accepts any positive lengths (rank r's run follows rank r-1's); zigzag needs the
    lengths that `shard_sequence` produces.
    """
    layout = check_layout(layout)
    if layout == "contiguous":
        if any(n < 1 for n in lengths):
            raise ValueError(f"every rank must hold at least one position, got lengths {lengths}")
        bounds, start = [], 0
        for n in lengths:
            bounds.append((start, start + n))
            start += n
        return [_with_offsets([b]) for b in bounds]
    expected = layout_segments(sum(lengths), len(lengths), layout)
    want = [sum(s.length for s in segs) for segs in expected]
    if list(lengths) != want:
        raise ValueError(
            f"zigzag chunks of a {sum(lengths)}-position sequence over {len(lengths)} ranks must "
            f"have lengths {want} (as shard_sequence makes them), got {list(lengths)}"
        )
    return expected


def positions_of(segments: Sequence[Segment], device: torch.device | None = None) -> Tensor:
    """(T_r,) global positions of a rank's local chunk, in local order."""
    parts = [torch.arange(s.start, s.stop, device=device) for s in segments]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=device)


def sequence_positions(
    seq_len: int,
    world_size: int,
    rank: int,
    *,
    layout: str = "contiguous",
    device: torch.device | str | None = None,
) -> Tensor:
    """(T_r,) global positions held by `rank`: what RoPE / learned positions need per chunk."""
    segments = layout_segments(seq_len, world_size, layout)
    _check_rank(rank, world_size)
    return positions_of(segments[rank], torch.device(device) if device is not None else None)


def _check_rank(rank: object, world_size: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    return rank


def _check_dim(x: Tensor, dim: object, name: str = "x") -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"dim must be an int in [{-x.dim()}, {x.dim()}) for {name} of shape "
            f"{tuple(x.shape)}, got {dim!r}"
        )
    return dim % x.dim()


def shard_sequence(
    x: Tensor, world_size: int, rank: int, *, dim: int, layout: str = "contiguous"
) -> Tensor:
    """`rank`'s chunk of the full sequence `x` (sequence along `dim`): (.., T, ..) -> (.., T_r, ..).

    Contiguous chunks are views; zigzag chunks are copies (two pieces concatenated).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    dim = _check_dim(x, dim)
    segments = layout_segments(x.shape[dim], world_size, layout)
    rank = _check_rank(rank, world_size)
    parts = [x.narrow(dim, s.start, s.length) for s in segments[rank]]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def unshard_sequence(chunks: Sequence[Tensor], *, dim: int, layout: str = "contiguous") -> Tensor:
    """The full sequence from every rank's chunk, listed in rank order: the inverse of
    `shard_sequence`. (.., T_r, ..) per rank -> (.., T, ..)."""
    if isinstance(chunks, Tensor) or not chunks or not all(isinstance(c, Tensor) for c in chunks):
        raise TypeError("chunks must be a non-empty sequence of tensors, one per rank")
    dim = _check_dim(chunks[0], dim, "chunks[0]")
    lengths = [c.shape[dim] for c in chunks]
    segments = segments_from_lengths(lengths, layout)
    pieces = [
        (s.start, chunk.narrow(dim, s.offset, s.length))
        for chunk, segs in zip(chunks, segments, strict=True)
        for s in segs
    ]
    pieces.sort(key=lambda p: p[0])  # global order
    return torch.cat([p for _, p in pieces], dim=dim)
