"""Which attention module is running: forward hooks keep a stack of module names, so anything
observing `functional.dispatch` can tell which layer a call came from."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..compat import MultiheadAttention as DropIn
from ..modules import MultiHeadAttention

ATTENTION_TYPES: tuple[type[nn.Module], ...] = (MultiHeadAttention, DropIn)


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every multihead attention module in `model`, in registration order."""
    return [
        (n or "attention", m) for n, m in model.named_modules() if isinstance(m, ATTENTION_TYPES)
    ]


class NameStack:
    def __init__(self) -> None:
        self.names: list[str] = []

    @property
    def current(self) -> str:
        return self.names[-1] if self.names else "attention"


@contextmanager
def tracked_names(model: nn.Module | None) -> Iterator[NameStack]:
    """Push each attention module's name while its forward runs.

    Also turns off torch's MHA fast path for the duration: inside TransformerEncoderLayer in
    eval it would call torch's fused kernel and skip the drop-in's forward (nothing to observe).
    """
    stack = NameStack()

    def enter(name: str):
        def hook(module, args) -> None:
            stack.names.append(name)

        return hook

    def leave(module, args, output) -> None:  # must return None: a value would replace output
        stack.names.pop()

    handles = []
    for name, module in attention_modules(model) if model is not None else []:
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave))
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield stack
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
        for h in handles:
            h.remove()
