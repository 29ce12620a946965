"""Which modules of a model are attention modules (they have the attention hook points)."""

from __future__ import annotations

from torch import nn


def is_attention(module: object) -> bool:
    """MultiHeadAttention and the torch drop-in (anything with a `hook_pattern` hook point)."""
    return "hook_pattern" in getattr(module, "hook_points", ())


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every multihead attention module in `model`, in registration order."""
    return [(n or "attention", m) for n, m in model.named_modules() if is_attention(m)]
