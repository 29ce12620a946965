"""Measure a causal model on held-out repeated-segment sequences: the loss on each copy and,
per head, the previous-token, induction and duplicate-token scores and the mass on BOS.

The held-out set is a list of layouts (where the two copies sit), each with its own rows of
sequences, all run in one forward. Every metric is linear in the attention weights, so the mean
over a layout's rows of the (L, H, T, T) weights gives each metric's mean over those rows in one
call; layouts are then averaged with equal weight. Offsets are chosen after averaging (per head,
on the whole held-out set), never per sequence.

Shapes: ids (B, T); weights per layer (B, H, T, T) -> stacked (L, H, T, T) after the mean.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..interpret import capture
from ..interpret import metrics as M
from .data import RepeatBatch, RepeatTask, probe_layouts, repeat_batch


@dataclass(frozen=True)
class HeldOut:
    """Held-out probe sequences, `per_layout` rows for each layout in turn, in one batch (one
    forward measures them all)."""

    batch: RepeatBatch
    layouts: tuple[tuple[int, int, int], ...]  # (first, second, length)
    per_layout: int

    @classmethod
    def make(cls, task: RepeatTask, layouts: int, per_layout: int, seed: int) -> HeldOut:
        g = torch.Generator().manual_seed(seed)
        chosen = tuple(probe_layouts(task, layouts, g))
        parts = [repeat_batch(task, per_layout, g, layout=layout) for layout in chosen]
        batch = RepeatBatch(
            *(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(RepeatBatch))
        )
        return cls(batch, chosen, per_layout)

    def groups(self) -> Iterator[tuple[slice, tuple[int, int, int]]]:
        """(rows, layout) of each layout's sequences."""
        for i, layout in enumerate(self.layouts):
            yield slice(i * self.per_layout, (i + 1) * self.per_layout), layout


@dataclass(frozen=True)
class Scores:
    """One measurement. Losses in nats per predicted token; per-head tensors are (L, H)."""

    loss_first: float
    loss_second: float
    previous: Tensor
    previous_offset: Tensor  # distance back of the best previous-token key (1 = i - 1)
    induction: Tensor
    induction_offset: Tensor  # key first + t + offset for a query at second + t
    induction_scan: Tensor  # (O, L, H): the score at each of M.INDUCTION_OFFSETS
    duplicate: Tensor
    sink: Tensor  # mass on the first token (BOS)


def copy_losses(logits: Tensor, batch: RepeatBatch) -> tuple[Tensor, Tensor]:
    """Summed cross-entropy and token counts on the first and the repeated copy: (2,), (2,)."""
    per_token = F.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch.ids[:, 1:], reduction="none"
    )  # (B, T - 1)
    masks = torch.stack(batch.copy_masks())  # (2, B, T - 1)
    return (per_token * masks).sum((1, 2)), masks.sum((1, 2))


def layer_weights(records, num_layers: int) -> Tensor:
    """(L, B, H, T, T) from one forward's capture records (one self-attention call per layer)."""
    if len(records) != num_layers:
        raise ValueError(f"expected {num_layers} attention calls, captured {len(records)}")
    return torch.stack([r.weights for r in records])


@torch.no_grad()
def measure(model: nn.Module, held_out: HeldOut, num_layers: int) -> Scores:
    was_training = model.training
    model.eval()
    with capture(model, keep_qkv=False) as records:
        logits = model(held_out.batch.ids)
    loss_sum, count = copy_losses(logits.double(), held_out.batch)
    weights = layer_weights(records, num_layers)  # (L, N, H, T, T)
    totals: list[Tensor] = []  # previous (D, L, H), induction (O, L, H), duplicate, sink
    for rows, (f, sec, n) in held_out.groups():
        attn = weights[:, rows].double().mean(1)  # (L, rows, H, T, T) -> (L, H, T, T)
        parts = [
            M.previous_by_distance(attn),
            M.copy_mass_by_offset(attn, f, sec, n),
            M.copy_mass(attn, f, sec, n, 0),
            M.sink_mass(attn),
        ]
        totals = parts if not totals else [t + p for t, p in zip(totals, parts, strict=True)]
    model.train(was_training)
    prev, ind, dup, sink = (t / len(held_out.layouts) for t in totals)
    previous, previous_offset = M.best_offset(prev, M.PREVIOUS_DISTANCES)
    induction, induction_offset = M.best_offset(ind, M.INDUCTION_OFFSETS)
    losses = (loss_sum / count).tolist()
    return Scores(
        losses[0],
        losses[1],
        previous.float(),
        previous_offset,
        induction.float(),
        induction_offset,
        ind.float(),
        dup.float(),
        sink.float(),
    )
