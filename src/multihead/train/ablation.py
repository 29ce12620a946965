"""Ablate one head at a time and measure the loss on the repeated copy without it.

Zero ablation sets the head's output to zero (a gate of 0 via `interpret.head_gates`). Mean
ablation replaces it by its mean output over the held-out set, so the rest of the model still
sees a typical value there; `mean_ablated` is the one function to re-implement on the hook
points (`run_with_hooks(model, ..., fwd_hooks=[("blocks.{i}.attn.hook_z", fn)])`) once they
exist in the library.

Shapes: z, a head's attention output before the output projection, (B, H, T, D); the mean
over held-out batches and positions (L, H, D); out_proj.weight (C, H * D).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..interpret import attention_modules, capture, head_gates
from .probe import HeldOut, copy_losses


def _gates(model: nn.Module, layer: int, head: int) -> Tensor:
    modules = attention_modules(model)
    gates = torch.ones(len(modules), int(modules[0][1].num_heads))  # type: ignore[arg-type]
    gates[layer, head] = 0.0
    return gates


def zero_ablated(model: nn.Module, layer: int, head: int) -> AbstractContextManager[None]:
    """While the block runs, head `head` of attention module `layer` outputs zeros."""
    return head_gates(model, _gates(model, layer, head))


@torch.no_grad()
def head_means(model: nn.Module, held_out: HeldOut) -> Tensor:
    """(L, H, D): each head's output z = weights @ v averaged over every held-out position."""
    was_training = model.training
    model.eval()
    ids = held_out.batch.ids
    with capture(model) as records:
        model(ids)
    zs = []
    for r in records:
        H, Hkv = r.weights.shape[1], r.v.shape[1]
        v = r.v.repeat_interleave(H // Hkv, dim=1)  # (B, Hkv, T, D) -> (B, H, T, D)
        zs.append((r.weights.double() @ v.double()).mean((0, 2)))  # (B, H, T, D) -> (H, D)
    model.train(was_training)
    return torch.stack(zs).float()  # (L, H, D)


@contextmanager
def mean_ablated(model: nn.Module, layer: int, head: int, means: Tensor) -> Iterator[None]:
    """While the block runs, head `head` of attention module `layer` outputs its mean `means[layer,
    head]` (D,) at every position.

    LOCAL HELPER until hook points land: the head is gated to 0 and W_O[:, head] @ mean is added
    to the output projection's bias, restored bit for bit on exit. With hooks this becomes a
    hook on `blocks.{layer}.attn.hook_z` that writes the mean into head `head`.
    """
    _, attn = attention_modules(model)[layer]
    proj = attn.out_proj
    assert isinstance(proj, nn.Linear)
    if proj.bias is None:
        raise ValueError("mean_ablated needs an output projection with a bias (bias=True)")
    D = int(attn.head_dim)  # type: ignore[arg-type]
    delta = proj.weight[:, head * D : (head + 1) * D] @ means[layer, head].to(proj.weight)  # (C,)
    saved = proj.bias.detach().clone()
    with torch.no_grad():
        proj.bias.add_(delta)
    try:
        with head_gates(model, _gates(model, layer, head)):
            yield
    finally:
        with torch.no_grad():
            proj.bias.copy_(saved)


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
    mean: float  # ... with the head replaced by its mean output


def ablate_heads(model: nn.Module, held_out: HeldOut) -> list[HeadAblation]:
    """Every head, zero- and mean-ablated in turn (layer-major order)."""
    means = head_means(model, held_out)
    L, H, _ = means.shape
    out = []
    for layer in range(L):
        for head in range(H):
            with zero_ablated(model, layer, head):
                zero = repeated_copy_loss(model, held_out)
            with mean_ablated(model, layer, head, means):
                mean = repeated_copy_loss(model, held_out)
            out.append(HeadAblation(layer, head, zero, mean))
    return out
