"""Which modules of a model are attention modules (they have the attention hook points)."""

from __future__ import annotations

from torch import nn

from ..hook_points import join, module_names


def is_attention(module: object) -> bool:
    """MultiHeadAttention and the torch drop-in (anything with a `hook_pattern` hook point)."""
    return "hook_pattern" in getattr(module, "hook_points", ())


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every multihead attention module in `model`, in registration order."""
    return [(n or "attention", m) for n, m in model.named_modules() if is_attention(m)]


def attention_hook_names(model: nn.Module, point: str) -> list[tuple[str, int]]:
    """(hook name of `point`, number of heads) for every attention module of `model`, in the
    order of `attention_modules` (the rows of `head_gates`): for CausalLM, BERT and the Encoder,
    row i is block i ("blocks.1.attn.hook_z"); a decoder's cross-attention has its own row
    after its block's self-attention."""
    prefixes = module_names(model)
    return [
        (join(prefixes[id(m)], point), int(getattr(m, "num_heads", 0)))
        for _, m in attention_modules(model)
    ]
