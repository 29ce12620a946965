"""Ablate one head at a time and measure the loss on the repeated copy without it.

Zero ablation sets the head's output (`blocks.{i}.attn.hook_z`, before the output projection)
to zero; mean ablation replaces it by its mean over the held-out sequences and positions, so
the rest of the model still sees a typical value there. Both through
`multihead.interpret.ablate`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..hooked.ablation import ablate
from ..hooked.scope import attention_modules
from .probe import HeldOut, copy_losses


@torch.no_grad()
def repeated_copy_loss(model: nn.Module, held_out: HeldOut) -> float:
    """Mean cross-entropy (nats) on the repeated copy's predictable tokens."""
    was_training = model.training
    model.eval()
    total, count = copy_losses(model(held_out.batch.ids).double(), held_out.batch)
    model.train(was_training)
    return float(total[1] / count[1])


@dataclass(frozen=True)
class HeadAblation:
    layer: int
    head: int
    zero: float  # repeated-copy loss with the head zeroed
    mean: float  # ... with the head replaced by its mean output over the held-out set


def ablate_heads(model: nn.Module, held_out: HeldOut) -> list[HeadAblation]:
    """Every head, zero- and mean-ablated in turn (layer-major order)."""
    was_training = model.training
    model.eval()
    out = []
    for layer, (_, module) in enumerate(attention_modules(model)):
        for head in range(int(module.num_heads)):  # type: ignore[arg-type]
            with ablate(model, [(layer, head)], "zero"):
                zero = repeated_copy_loss(model, held_out)
            with ablate(model, [(layer, head)], "mean", reference=held_out.batch.ids):
                mean = repeated_copy_loss(model, held_out)
            out.append(HeadAblation(layer, head, zero, mean))
    model.train(was_training)
    return out
