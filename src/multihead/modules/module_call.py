"""Calling a child module as its `forward`, where `Module.__call__` would add nothing: no hooks
of its own or global (forward or backward), no forward set on the instance (accelerate's hooks
replace `module.forward`), no `Module.compile()` (its compiled call lives in `__call__`), no
TorchScript tracing. A decode step's plain paths call a few
children per layer; measured on SmolLM2's eager step (one thread, in one process), `__call__`
around the norms, attention and MLP cost ~2 ms of ~34 per token.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as _module


def bare(*modules: nn.Module | None) -> bool:
    """Whether calling each module (None: skipped) is exactly calling its forward."""
    if (
        _module._global_forward_hooks
        or _module._global_forward_pre_hooks
        or _module._global_backward_hooks
        or _module._global_backward_pre_hooks
        or torch._C._get_tracing_state()
    ):
        return False
    for m in modules:
        if m is not None and (
            m._forward_hooks
            or m._forward_pre_hooks
            or m._backward_hooks
            or m._backward_pre_hooks
            or "forward" in m.__dict__
            or m._compiled_call_impl is not None
        ):
            return False
    return True
