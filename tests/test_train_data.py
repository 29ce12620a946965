"""The demos' synthetic data: repeated segments and reversal, invariants and determinism."""

import pytest
import torch

from multihead.train.data import (
    BOS,
    PAD,
    REVERSE_BOS,
    RepeatTask,
    ReverseTask,
    probe_layouts,
    repeat_batch,
    reverse_batch,
)


@pytest.mark.parametrize("bos", [True, False])
def test_repeat_batch_copies_the_segment(bos):
    task = RepeatTask(vocab_size=13, context=29, segment=(3, 9), gap=(0, 5), bos=bos)
    b = repeat_batch(task, 200, torch.Generator().manual_seed(1))
    assert b.ids.shape == (200, 29)
    assert int(b.ids.min()) >= 0 and int(b.ids.max()) < 13
    if bos:
        assert (b.ids[:, 0] == BOS).all() and (b.ids[:, 1:] != BOS).all() and (b.first >= 1).all()
    for row, f, s, n in zip(b.ids, b.first, b.second, b.length, strict=True):
        assert 3 <= n <= 9 and 0 <= s - f - n <= 5 and s + n <= 29
        assert torch.equal(row[s : s + n], row[f : f + n])
    # every allowed length, gap and start occurs (the draw covers the ranges)
    assert set(b.length.tolist()) == set(range(3, 10))
    assert set((b.second - b.first - b.length).tolist()) == set(range(6))


def test_copy_masks_cover_the_predictable_tokens():
    task = RepeatTask(vocab_size=20, context=24, segment=(4, 4), gap=(2, 2))
    b = repeat_batch(task, 1, torch.Generator(), layout=(3, 9, 4))
    first, second = b.copy_masks()
    # logits position i predicts token i + 1: the copies' tokens 4..6 and 10..12
    assert first[0].nonzero()[:, 0].tolist() == [3, 4, 5]
    assert second[0].nonzero()[:, 0].tolist() == [9, 10, 11]


def test_same_generator_state_same_batches():
    task = RepeatTask()
    a = repeat_batch(task, 8, torch.Generator().manual_seed(5))
    b = repeat_batch(task, 8, torch.Generator().manual_seed(5))
    c = repeat_batch(task, 8, torch.Generator().manual_seed(6))
    assert torch.equal(a.ids, b.ids) and not torch.equal(a.ids, c.ids)
    layouts = probe_layouts(task, 5, torch.Generator().manual_seed(0))
    assert len(layouts) == 5 and all(f + n <= s for f, s, n in layouts)


def test_repeat_task_errors():
    with pytest.raises(ValueError, match="cannot hold two segments of 12 tokens and a gap of 9"):
        RepeatTask(context=32, gap=(0, 9))
    with pytest.raises(ValueError, match="segment must be a range"):
        RepeatTask(segment=(5, 2))
    with pytest.raises(ValueError, match=r"layout \(1, 3, 4\) does not fit"):
        repeat_batch(RepeatTask(), 2, torch.Generator(), layout=(1, 3, 4))


def test_reverse_batch():
    task = ReverseTask(vocab_size=11, length=(2, 7))
    b = reverse_batch(task, 100, torch.Generator().manual_seed(0))
    assert b.src.shape == b.tgt_in.shape == b.tgt_out.shape == (100, 7)
    for i in range(100):
        n = int(b.lengths[i])
        src = b.src[i, :n]
        assert (src >= 2).all() and (b.src[i, n:] == PAD).all()
        assert b.src_mask[i].tolist() == [True] * n + [False] * (7 - n)
        assert torch.equal(b.tgt_out[i, :n], src.flip(0)) and (b.tgt_out[i, n:] == PAD).all()
        assert int(b.tgt_in[i, 0]) == REVERSE_BOS
        assert torch.equal(b.tgt_in[i, 1:], b.tgt_out[i, :-1])
    one = b.rows(slice(3, 4))
    assert torch.equal(one.src, b.src[3:4]) and torch.equal(one.lengths, b.lengths[3:4])
