"""Synthetic data for the demos: random tokens with a repeated segment (induction) and random
sequences with their reversal (sequence to sequence). All randomness comes from a
`torch.Generator` the caller passes, so the same seed gives the same batches.

Shapes: ids (B, T); first, second, length (B,); masks over predicted positions (B, T - 1),
where position i of the logits predicts token i + 1.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

BOS = 0  # token 0 opens every sequence when the task has a BOS token; content tokens are 1..V-1
PAD = 0  # reversal: padding id (never a content token)


@dataclass(frozen=True)
class RepeatTask:
    """Sequences of `context` tokens: [BOS] random tokens, a segment of `segment` tokens, a gap
    of `gap` random tokens, the segment again, random tokens to the end."""

    vocab_size: int = 32
    context: int = 32
    segment: tuple[int, int] = (6, 12)  # inclusive range of segment lengths
    gap: tuple[int, int] = (0, 4)  # inclusive range of gap lengths
    bos: bool = True

    def __post_init__(self) -> None:
        lo, hi = self.segment
        if not 1 <= lo <= hi:
            raise ValueError(
                f"segment must be a range (lo, hi) with 1 <= lo <= hi, got {self.segment}"
            )
        glo, ghi = self.gap
        if not 0 <= glo <= ghi:
            raise ValueError(f"gap must be a range (lo, hi) with 0 <= lo <= hi, got {self.gap}")
        room = self.context - int(self.bos)
        if 2 * hi + ghi > room:
            raise ValueError(
                f"context {self.context} cannot hold two segments of {hi} tokens and a gap of "
                f"{ghi}" + (" after the BOS token" if self.bos else "")
            )
        if self.vocab_size < 3:
            raise ValueError(f"vocab_size must be at least 3, got {self.vocab_size}")

    @property
    def first_content(self) -> int:
        """The smallest content token id (1 with a BOS token, else 0)."""
        return 1 if self.bos else 0


@dataclass(frozen=True)
class RepeatBatch:
    ids: Tensor  # (B, T)
    first: Tensor  # (B,) start of the first copy
    second: Tensor  # (B,) start of the repeated copy
    length: Tensor  # (B,) segment length

    def copy_masks(self) -> tuple[Tensor, Tensor]:
        """(B, T - 1) masks over predicted positions: the tokens of the first copy and of the
        repeated copy, each without its first token (which nothing in the text predicts)."""
        target = torch.arange(1, self.ids.shape[1])[None]  # (1, T - 1): the predicted token
        f, s, n = self.first[:, None], self.second[:, None], self.length[:, None]
        in_first = (target > f) & (target < f + n)
        in_second = (target > s) & (target < s + n)
        return in_first, in_second


def repeat_batch(
    task: RepeatTask,
    batch_size: int,
    generator: torch.Generator,
    *,
    layout: tuple[int, int, int] | None = None,
) -> RepeatBatch:
    """`batch_size` sequences of `task`. `layout` = (first, second, length) fixes where the copies
    sit for every row (held-out probes average attention over rows that share it); by default
    each row draws its own segment length, gap and start."""
    B, T = batch_size, task.context
    ids = torch.randint(task.first_content, task.vocab_size, (B, T), generator=generator)
    if layout is None:
        n = torch.randint(task.segment[0], task.segment[1] + 1, (B,), generator=generator)
        gap = torch.randint(task.gap[0], task.gap[1] + 1, (B,), generator=generator)
        start = int(task.bos)
        slack = T - start - 2 * n - gap  # (B,) >= 0 by the task's check
        first = start + (torch.rand(B, generator=generator) * (slack + 1)).long()
        second = first + n + gap
    else:
        f, s, length = layout
        if not (int(task.bos) <= f and f + length <= s and s + length <= T):
            raise ValueError(f"layout {layout} does not fit a context of {T} tokens")
        first, second, n = (torch.full((B,), v) for v in (f, s, length))
    j = torch.arange(T)[None]  # (1, T)
    in_copy = (j >= second[:, None]) & (j < (second + n)[:, None])  # (B, T)
    source = (j - (second - first)[:, None]).clamp(min=0)
    ids = torch.where(in_copy, ids.gather(1, source), ids)
    if task.bos:
        ids[:, 0] = BOS
    return RepeatBatch(ids, first, second, n)


def probe_layouts(
    task: RepeatTask, count: int, generator: torch.Generator
) -> list[tuple[int, int, int]]:
    """`count` (first, second, length) layouts drawn as `repeat_batch` draws them."""
    b = repeat_batch(task, count, generator)
    return [
        (int(f), int(s), int(n))
        for f, s, n in zip(b.first.tolist(), b.second.tolist(), b.length.tolist(), strict=True)
    ]


@dataclass(frozen=True)
class ReverseTask:
    """Source: `length` random tokens (2..V-1), padded with PAD; target: BOS=1, the source
    reversed. A token at target position t + 1 is source token n - 1 - t: the true alignment
    of decoder query t is source position n - 1 - t."""

    vocab_size: int = 24
    length: tuple[int, int] = (6, 12)

    def __post_init__(self) -> None:
        lo, hi = self.length
        if not 1 <= lo <= hi:
            raise ValueError(
                f"length must be a range (lo, hi) with 1 <= lo <= hi, got {self.length}"
            )
        if self.vocab_size < 4:
            raise ValueError(f"vocab_size must be at least 4, got {self.vocab_size}")


REVERSE_BOS = 1


@dataclass(frozen=True)
class ReverseBatch:
    src: Tensor  # (B, S) tokens, PAD after each row's length
    src_mask: Tensor  # (B, S) True = a real token
    tgt_in: Tensor  # (B, S) BOS then the reversed source (teacher forcing input)
    tgt_out: Tensor  # (B, S) the reversed source, PAD after the length
    lengths: Tensor  # (B,)

    def rows(self, index: slice) -> ReverseBatch:
        """The sequences at `index` (a slice keeps the batch axis)."""
        return ReverseBatch(*(getattr(self, f.name)[index] for f in fields(self)))


def reverse_batch(task: ReverseTask, batch_size: int, generator: torch.Generator) -> ReverseBatch:
    B, S = batch_size, task.length[1]
    n = torch.randint(task.length[0], task.length[1] + 1, (B,), generator=generator)
    tokens = torch.randint(2, task.vocab_size, (B, S), generator=generator)
    j = torch.arange(S)[None]  # (1, S)
    mask = j < n[:, None]
    src = torch.where(mask, tokens, PAD)
    # target position t holds source token n - 1 - t
    rev = src.gather(1, (n[:, None] - 1 - j).clamp(min=0))
    tgt_out = torch.where(mask, rev, PAD)
    tgt_in = torch.cat([torch.full((B, 1), REVERSE_BOS), tgt_out[:, :-1]], dim=1)
    return ReverseBatch(src, mask, tgt_in, tgt_out, n)
