"""Sequence layouts, the tile schedule and the dropout mask of multihead.parallel: pure functions,
tested in this process (no process group)."""

from __future__ import annotations

import pytest
import torch

from multihead.functional.dropout_mask import _mix, _mix_int
from multihead.parallel import (
    dropout_keep_mask,
    layout_segments,
    ring_attention,
    sequence_positions,
    shard_sequence,
    unshard_sequence,
)
from multihead.parallel.layout import segments_from_lengths
from multihead.parallel.schedule import tile_pairs, work


def positions(T: int, P: int, layout: str) -> list[list[int]]:
    return [sequence_positions(T, P, r, layout=layout).tolist() for r in range(P)]


def test_layouts_by_hand():
    assert positions(7, 3, "contiguous") == [[0, 1, 2], [3, 4], [5, 6]]
    assert positions(8, 2, "zigzag") == [[0, 1, 6, 7], [2, 3, 4, 5]]
    # 11 positions in 6 pieces: sizes 2 2 2 2 2 1; rank r holds pieces r and 5 - r.
    assert positions(11, 3, "zigzag") == [[0, 1, 10], [2, 3, 8, 9], [4, 5, 6, 7]]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize(("T", "P"), [(8, 2), (13, 4), (9, 1), (23, 3)])
def test_shard_unshard_round_trip(layout, T, P):
    x = torch.randn(2, 3, T, 5)
    chunks = [shard_sequence(x, P, r, dim=2, layout=layout) for r in range(P)]
    for r, chunk in enumerate(chunks):
        # Each chunk holds exactly the positions its rank is said to hold.
        assert torch.equal(chunk, x[:, :, sequence_positions(T, P, r, layout=layout)])
    assert torch.equal(unshard_sequence(chunks, dim=2, layout=layout), x)
    assert torch.equal(unshard_sequence(chunks, dim=-2, layout=layout), x)
    every = torch.cat([sequence_positions(T, P, r, layout=layout) for r in range(P)])
    assert sorted(every.tolist()) == list(range(T))  # each position exactly once


def test_layout_errors():
    with pytest.raises(ValueError, match="layout must be one of"):
        layout_segments(8, 2, "ring")
    with pytest.raises(ValueError, match="zigzag layout over 3 ranks needs at least 6"):
        layout_segments(5, 3, "zigzag")
    with pytest.raises(ValueError, match="contiguous layout over 4 ranks needs at least 4"):
        shard_sequence(torch.zeros(1, 3), 4, 0, dim=1)
    with pytest.raises(ValueError, match="dim must be an int in"):
        shard_sequence(torch.zeros(1, 3), 1, 0, dim=2)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\)"):
        shard_sequence(torch.zeros(1, 4), 2, 2, dim=1)
    with pytest.raises(TypeError, match="chunks must be a non-empty sequence"):
        unshard_sequence(torch.zeros(2, 3), dim=1)
    with pytest.raises(ValueError, match=r"must have lengths \[4, 4\].*got \[5, 3\]"):
        segments_from_lengths([5, 3], "zigzag")
    with pytest.raises(ValueError, match="at least one position"):
        segments_from_lengths([3, 0], "contiguous")


def test_ring_attention_needs_a_process_group():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="init_process_group"):
        ring_attention(q, q, q)


def _causal_allowed(q_pos: list[int], k_pos: list[int]) -> torch.Tensor:
    return torch.tensor(k_pos)[None, :] <= torch.tensor(q_pos)[:, None]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize(("T", "P", "block"), [(16, 4, 2), (13, 3, 3), (11, 2, 64)])
def test_tile_plan_covers_each_allowed_entry_once(layout, T, P, block):
    """Skipped tiles hold no allowed entry, unmasked ones only allowed entries, and over all ring
    steps each (query, key) pair is computed exactly once."""
    segments = layout_segments(T, P, layout)
    for causal in (False, True):
        for rank in range(P):
            q_pos = sequence_positions(T, P, rank, layout=layout).tolist()
            covered = torch.zeros(len(q_pos), T, dtype=torch.long)
            for source in range(P):
                for pair in tile_pairs(segments[rank], segments[source], causal=causal,
                                       block_size=block):  # fmt: skip
                    qt, kt = pair.queries, pair.keys
                    assert qt.length <= block and kt.length <= block
                    rows = list(range(qt.start, qt.start + qt.length))
                    cols = list(range(kt.start, kt.start + kt.length))
                    allowed = _causal_allowed(rows, cols)
                    if causal and not pair.diagonal:
                        assert allowed.all()
                    if pair.diagonal:
                        assert allowed.any() and not allowed.all()
                    covered[qt.offset : qt.offset + qt.length, kt.start : kt.start + kt.length] += 1
            want = _causal_allowed(q_pos, list(range(T))) if causal else torch.ones(len(q_pos), T)
            # Allowed entries exactly once; blocked ones only inside a computed diagonal tile.
            assert (covered[want.bool()] == 1).all()
            assert (covered <= 1).all()


def test_zigzag_balances_causal_work():
    T, P = 64, 4
    spread = {}
    for layout in ("zigzag", "contiguous"):
        segments = layout_segments(T, P, layout)
        per_rank = [
            sum(work(tile_pairs(segments[r], segments[s], causal=True, block_size=8))
                for s in range(P))
            for r in range(P)
        ]  # fmt: skip
        spread[layout] = max(per_rank) / min(per_rank)
    # Zig-zag: every rank computes the same; contiguous: the last rank P+ times the first.
    assert spread["zigzag"] == 1.0 and spread["contiguous"] >= P, spread


def test_mix_matches_on_host_and_tensor():
    values = [0, 1, 2**31, 2**32 - 1, 123456789, 987654321]
    got = _mix(torch.tensor(values, dtype=torch.long)).tolist()
    assert got == [_mix_int(x) for x in values]
    assert all(0 <= x < 2**32 for x in got)
    # The mix is a bijection on 32 bits: distinct inputs never collide (an overflow would).
    spread = _mix(torch.arange(2**32 - 5000, 2**32, dtype=torch.long))
    assert spread.unique().numel() == 5000 and int(spread.max()) > 2**31


def test_dropout_mask_is_per_entry_and_seeded():
    B, H, T, p = 2, 3, 40, 0.3
    index = torch.arange(T)
    full = dropout_keep_mask(17, p, B, H, index, index)
    assert full.shape == (B, H, T, T) and full.dtype == torch.bool
    # The kept fraction is 1 - p (2400 draws: within 4 standard deviations).
    assert abs(full.float().mean().item() - (1 - p)) < 4 * (p * (1 - p) / full.numel()) ** 0.5
    # Any tile of global positions gives the same entries as the full mask.
    rows, cols = torch.tensor([3, 4, 5, 37]), torch.tensor([0, 22, 23])
    assert torch.equal(dropout_keep_mask(17, p, B, H, rows, cols), full[:, :, rows][..., cols])
    # Other seeds give other masks; p = 0 keeps everything.
    assert not torch.equal(dropout_keep_mask(18, p, B, H, index, index), full)
    assert not torch.equal(dropout_keep_mask(17 + 2**40, p, B, H, index, index), full)
    assert dropout_keep_mask(17, 0.0, B, H, index, index).all()
    # Rows of different heads and batch items are not copies of each other.
    assert not torch.equal(full[0, 0], full[0, 1]) and not torch.equal(full[0, 0], full[1, 0])


def test_dropout_mask_errors():
    index = torch.arange(3)
    with pytest.raises(ValueError, match="dropout_seed must be an int"):
        dropout_keep_mask(-1, 0.1, 1, 1, index, index)
    with pytest.raises(ValueError, match="dropout_seed must be an int"):
        dropout_keep_mask(True, 0.1, 1, 1, index, index)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        dropout_keep_mask(0, 1.0, 1, 1, index, index)
