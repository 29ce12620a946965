"""Conversions: torch.nn.MultiheadAttention <-> the drop-in <-> multihead.MultiHeadAttention,
and `replace_attention` for whole models."""

from __future__ import annotations

from torch import nn

from ..modules import MultiHeadAttention
from . import weights
from .encoder_layer import keep_attention_running
from .multihead_attention import MultiheadAttention


def from_torch(module: nn.MultiheadAttention) -> MultiheadAttention:
    """A drop-in with the same configuration, weights, device, dtype and train/eval mode."""
    return MultiheadAttention.from_torch(module)


def to_torch(module: MultiheadAttention) -> nn.MultiheadAttention:
    """A plain torch.nn.MultiheadAttention with the same configuration and weights."""
    return weights.rebuild(module, nn.MultiheadAttention)


def to_modern(module: nn.MultiheadAttention) -> MultiHeadAttention:
    """torch's (or the drop-in's) weights in a `multihead.MultiHeadAttention` (batch-first)."""
    return weights.to_modern(module)


def from_modern(module: MultiHeadAttention, *, batch_first: bool = True) -> MultiheadAttention:
    """A drop-in holding a `multihead.MultiHeadAttention`'s weights."""
    return MultiheadAttention.from_modern(module, batch_first=batch_first)


def replace_attention(model: nn.Module) -> nn.Module:
    """Swap every torch.nn.MultiheadAttention inside `model` for the drop-in, in place.

    Weights, device, dtype and mode carry over, so the model's outputs are unchanged. torch's
    encoder layers and encoders are switched (in place) to always call their attention module:
    their fused eval fast path would bypass the drop-in (see `encoder_layer`). Returns
    `model` (or, when `model` itself is a torch.nn.MultiheadAttention, its drop-in).
    """
    if type(model) is nn.MultiheadAttention:
        return from_torch(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.MultiheadAttention:
                setattr(parent, name, from_torch(child))
    keep_attention_running(model)
    return model
