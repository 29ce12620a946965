"""Finding a transformers model's parts: its layer lists, each layer's attention and MLP, the
attention's output projection, and where the residual stream between attention and MLP can be
read. Generic rules first (a ModuleList whose every element holds an attention module; the
innermost submodule whose class is named *Attention*), small name tables where a rule cannot
tell (which child is the MLP, which norm precedes it).

Everything is found and checked before the bridge changes anything: a model either gets every
hook point on every layer, or an error that names the architecture and what is missing.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from torch import nn

# The attention's output projection (one linear over the concatenated heads), by name.
OUT_PROJ_NAMES = ("o_proj", "out_proj", "dense", "o", "c_proj", "wo")
# The module whose output is the MLP branch (hook_mlp_out), by name, in order of preference:
# a module (Llama-likes, MoE blocks), OPT's second linear, T5's dense block.
MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "ffn", "fc2", "DenseReluDense")
# The norm in front of the MLP, whose input is the residual stream after attention.
PRE_MLP_NORMS = ("pre_feedforward_layernorm", "final_layer_norm", "ln_2")
# The final norm of a decoder stack (the logit lens reads through it).
FINAL_NORMS = ("norm", "final_layer_norm", "final_layernorm", "ln_f", "norm_f")
REGISTRY_CALL = "ALL_ATTENTION_FUNCTIONS"


class BridgeError(ValueError):
    """A transformers model the bridge cannot route through multihead (the message says why)."""


@dataclass
class LayerParts:
    layer: nn.Module
    attn_path: str  # relative to the layer
    attn: nn.Module
    out_proj: nn.Linear | None
    mlp_path: str
    mlp: nn.Module
    # where hook_resid_mid is shown: ("norm", module) its input; ("mlp", module) the MLP's
    # input (no norm in front of it); ("sublayer", module) a sublayer's output that the layer
    # adds on from (T5); None: a parallel block has no such stream
    mid: tuple[str, nn.Module] | None
    cross_path: str | None = None
    cross: nn.Module | None = None
    cross_out_proj: nn.Linear | None = None
    cross_mid: nn.Module | None = None  # T5's cross-attention sublayer (hook_resid_mid_cross)


@dataclass
class Stack:
    path: str  # the ModuleList's path in the model ("model.layers", "encoder.block")
    layers: list[LayerParts] = field(default_factory=list)


def _is_attention(module: nn.Module) -> bool:
    return "Attention" in type(module).__name__ and any(
        isinstance(c, nn.Linear) for c in module.children()
    )


def _attention_modules(layer: nn.Module) -> list[tuple[str, nn.Module]]:
    """Innermost attention modules of a layer, in registration order."""
    found = [(n, m) for n, m in layer.named_modules() if n and _is_attention(m)]
    return [(n, m) for n, m in found if not any(o.startswith(n + ".") for o, _ in found)]


def _child(module: nn.Module, names: tuple[str, ...]) -> tuple[str, nn.Module] | None:
    for name in names:
        sub = getattr(module, name, None)
        if isinstance(sub, nn.Module) and name in dict(module.named_children()):
            return name, sub
    return None


def _find_mlp(layer: nn.Module) -> tuple[str, nn.Module] | None:
    named = dict(layer.named_modules())
    for wanted in MLP_NAMES:
        for path, module in named.items():
            if path.rsplit(".", 1)[-1] == wanted:
                return path, module
    return None


def _find_mid(
    layer: nn.Module, attn_path: str, mlp: nn.Module, parallel: bool
) -> tuple[str, nn.Module] | None:
    parts = attn_path.split(".")
    if len(parts) >= 3 and isinstance(layer.get_submodule(".".join(parts[:-2])), nn.ModuleList):
        # T5-style: attention inside a sublayer (norm, attention, dropout, residual add)
        return "sublayer", layer.get_submodule(".".join(parts[:-1]))
    if parallel:
        return None
    children = dict(layer.named_children())
    for name in PRE_MLP_NORMS:
        if name in children:
            return "norm", children[name]
    if "post_attention_layernorm" in children:
        if "post_feedforward_layernorm" in children:  # OLMo 2: post-norms, nothing before MLP
            return "mlp", mlp
        return "norm", children["post_attention_layernorm"]
    return None  # one norm feeds both branches: a parallel block (Phi, Cohere)


def uses_registry(model_cls: Any) -> bool:
    """transformers' own test of a model class (its module's attention classes call the
    registry), where this transformers has it; the per-module test in `discover` runs anyway."""
    check = getattr(model_cls, "_can_set_attn_implementation", None)
    return True if check is None else bool(check())


def _uses_registry(cls: Any) -> bool:
    try:
        return REGISTRY_CALL in inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False


def discover(model: nn.Module, config: object) -> list[Stack]:
    """The model's layer stacks with their parts; BridgeError naming what is missing."""
    arch = type(model).__name__
    lists = [
        (path, m)
        for path, m in model.named_modules()
        if isinstance(m, nn.ModuleList)
        and len(m) > 0
        and all(_attention_modules(layer) for layer in m)
    ]
    lists = [(p, m) for p, m in lists if not any(p.startswith(o + ".") for o, _ in lists)]
    if not lists:
        raise BridgeError(
            f"{arch}: no list of layers with attention modules found (an nn.ModuleList whose "
            "every layer holds a submodule whose class is named *Attention* with linear "
            "projections); the bridge cannot place its hook points"
        )
    not_registry = sorted(
        {
            type(a).__name__
            for _, stack in lists
            for layer in stack
            for _, a in _attention_modules(layer)
            if not _uses_registry(type(a))
        }
    )
    if not_registry:
        raise BridgeError(
            f"{arch}: its attention ({', '.join(not_registry)}) computes attention itself "
            f"instead of calling transformers' attention registry ({REGISTRY_CALL}), so "
            "multihead's attention cannot be put inside it"
        )
    parallel = bool(getattr(config, "use_parallel_residual", False))
    stacks = []
    for path, stack in lists:
        found = Stack(path)
        for i, layer in enumerate(stack):
            where = f"{arch}: layer {path}.{i} ({type(layer).__name__})"
            attns = _attention_modules(layer)
            if len(attns) > 2:
                names = ", ".join(n for n, _ in attns)
                raise BridgeError(f"{where} holds {len(attns)} attention modules ({names})")
            mlp = _find_mlp(layer)
            if mlp is None:
                raise BridgeError(
                    f"{where} has no MLP submodule named one of {', '.join(MLP_NAMES)}"
                )
            (attn_path, attn), *cross = attns
            out = _child(attn, OUT_PROJ_NAMES)
            parts = LayerParts(
                layer,
                attn_path,
                attn,
                out[1] if out and isinstance(out[1], nn.Linear) else None,
                mlp[0],
                mlp[1],
                _find_mid(layer, attn_path, mlp[1], parallel),
            )
            if cross:
                parts.cross_path, parts.cross = cross[0]
                cout = _child(parts.cross, OUT_PROJ_NAMES)
                parts.cross_out_proj = cout[1] if cout and isinstance(cout[1], nn.Linear) else None
                if parts.mid is not None and parts.mid[0] == "sublayer":
                    segments = parts.cross_path.split(".")
                    parts.cross_mid = layer.get_submodule(".".join(segments[:-1]))
            found.layers.append(parts)
        stacks.append(found)
    return stacks


def final_norm(model: nn.Module, stack_path: str) -> nn.Module | None:
    """The final norm beside a decoder's layer list (`model.norm`, `decoder.final_layer_norm`)."""
    parent = model.get_submodule(stack_path.rsplit(".", 1)[0]) if "." in stack_path else model
    found = _child(parent, FINAL_NORMS)
    return found[1] if found else None
