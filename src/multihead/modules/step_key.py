"""What a compiled decode step assumes of the model it was compiled for: `model_key(model)`.

`generate(compile=True)` compiles its decode step with dynamo's guards on the model's modules
left out (`torch.compiler.skip_guard_on_all_nn_modules_unsafe`, a per-compile option): for
SmolLM2 that is ~7,600 of a step's ~8,600 guards (every module's type, attributes and hook
dicts along every parameter's path), checked before every token. The compiled code still reads
the parameters and buffers of the model it is given at each call (they are graph inputs), so
what those guards protected is the model's *structure*: its module types, their attribute
values, how tensors are laid out (shape, stride, dtype, device) and which of them share storage
(a tied head). This key captures that structure, computed once per `generate` call (~8 ms for
SmolLM2's 518 modules); each model and key gets a decode step under a code object of its own
(`generation._step_for`), so dynamo's cache for one code object only ever holds code compiled
for one structure. Anything that changes a compiled step's assumptions (a replaced or re-typed
module, a weight of another dtype or layout, untied weights, a changed config, a registered
hook) gives another key, hence a fresh compile.

The key holds values, types, and the `id` of objects it cannot describe by value (functions,
hooks, a tokenizer): it is compared, never stored on the model.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor, nn

_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, enum.Enum)
_PLAIN = frozenset({type(None), bool, int, float, str})
_DICTS = frozenset({dict, OrderedDict})
_MODULE_SLOTS = ("_parameters", "_buffers", "_modules")  # described by the walk itself


def model_key(model: nn.Module) -> tuple:
    """A hashable description of `model`'s structure (see the module docstring): equal keys,
    equal compiled decode steps."""
    modules = {id(m): i for i, (_, m) in enumerate(model.named_modules(remove_duplicate=False))}
    storages: dict[tuple, int] = {}  # (device, storage address) -> first tensor sharing it
    parts: list[tuple] = []
    for name, module in model.named_modules(remove_duplicate=False):
        state: list[tuple] = [(name, type(module))]
        for k, v in vars(module).items():  # (inline for the common cases: ~10,000 values)
            kind = type(v)
            if kind in _PLAIN:
                state.append((k, kind, v))
            elif kind in _DICTS and not v:  # a module's hook dicts
                state.append((k, kind))
            elif k not in _MODULE_SLOTS:
                state.append((k, _describe(v, modules, storages, 0)))
        parts.append(tuple(state))
        for slot in ("_parameters", "_buffers"):
            tensors = vars(module).get(slot, {})
            parts.append((slot, *((k, _tensor(t, storages)) for k, t in tensors.items())))
        parts.append(("_modules", *((k, modules.get(id(m))) for k, m in module._modules.items())))
    return tuple(parts)


def _tensor(t: Tensor | None, storages: dict[tuple, int]) -> tuple | None:
    """Layout and sharing of one tensor (its values are the step's inputs, not its key)."""
    if t is None:
        return None
    if t.is_meta or not hasattr(t, "untyped_storage"):
        shared = None
    else:
        address = (t.device, t.untyped_storage().data_ptr())
        shared = storages.setdefault(address, len(storages))
    return (
        type(t),
        tuple(t.shape),
        t.stride(),
        t.storage_offset(),
        t.dtype,
        t.device,
        t.requires_grad,
        shared,
    )


def _describe(value: Any, modules: dict[int, int], storages: dict[tuple, int], depth: int) -> Any:
    """A hashable stand-in for an attribute value: scalars as themselves, containers and
    dataclasses (configs) by their contents, tensors by layout, modules by their place in the
    walk, anything else (functions, hooks, tokenizers) by type and identity."""
    kind = type(value)
    if kind in _PLAIN:  # (the common cases first: this runs ~10,000 times for SmolLM2)
        return (kind, value)
    if kind in _DICTS and not value:  # (a module's hook dicts)
        return (kind,)
    if isinstance(value, _SCALARS):
        return (kind, value)
    if isinstance(value, Tensor):
        return _tensor(value, storages)
    if isinstance(value, nn.Module):
        return ("module", modules.get(id(value), id(value)))
    if depth > 4:
        return (kind, id(value))
    if isinstance(value, (tuple, list, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return (kind, *(_describe(v, modules, storages, depth + 1) for v in items))
    if isinstance(value, dict):
        if not value:
            return (kind,)
        pairs = ((repr(k), _describe(v, modules, storages, depth + 1)) for k, v in value.items())
        return (kind, *pairs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return (kind, *((k, _describe(v, modules, storages, depth + 1)) for k, v in fields))
    return (kind, id(value))
