"""The bridge's hook points on a transformers model's modules: the names (`hook_alias` steps from
the model down to each layer's attention and MLP), the points each module shows
(`hook_points`), and the torch forward hooks that show the layer's stream, the attention and
MLP outputs and each head's result to the hook sessions open in this context (one ContextVar
read each when none is).

Shapes: the stream (B, T, C); `hook_result` (B, T, H, C).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from torch import Tensor, nn

from ..hook_points import hooks_for
from ..modules.attend import ATTENTION_HOOK_POINTS, head_results
from .discover import BridgeError, LayerParts

# id(layer) -> the shape of the stream it received in the running forward (recorded only while
# hooks observe the layer), for the tensors of an MLP that runs on flattened tokens
_SHAPES: ContextVar[dict[int, tuple[int, ...]] | None] = ContextVar(
    "multihead_bridge_shapes", default=None
)


# id(layer) -> what a replaced hook_resid_mid added to the stream, until the layer's output
_DELTAS: ContextVar[dict[int, Tensor] | None] = ContextVar("multihead_bridge_deltas", default=None)


def _first(out: Any) -> Tensor:
    return out if isinstance(out, Tensor) else out[0]


def _with_first(out: Any, x: Tensor) -> Any:
    if isinstance(out, Tensor):
        return x
    return (x, *out[1:]) if isinstance(out, tuple) else out.__class__(x, *out[1:])


def _stream_view(owner: nn.Module, x: Tensor) -> Tensor:
    """A layer's (B * T, C) tensor as (B, T, C) (OPT runs its MLP on flattened tokens), from
    the shape its layer received in this forward; other tensors as they are."""
    shape = (_SHAPES.get() or {}).get(id(owner))
    if x.dim() == 2 and shape is not None and len(shape) == 3:
        return x.view(shape[0], shape[1], x.shape[-1])
    return x


def show(owner: nn.Module, point: str, out: Any) -> Any:
    """A forward hook's body: show the output's first tensor at `owner`'s `point`."""
    hooks = hooks_for(owner)
    if hooks is None or point not in hooks:
        return None
    x = _first(out)
    seen = _stream_view(owner, x)
    y = hooks(point, seen)
    return None if y is seen else _with_first(out, y.reshape(x.shape))


def _mid(layer: nn.Module, x: Tensor) -> Tensor | None:
    """hook_resid_mid at the input of the norm in front of the MLP (or of the MLP): a
    replacement y goes into the MLP, and y - x is kept for the layer's output (transformers'
    layer adds the MLP's output to its own copy x of the stream), so the block computes
    y + MLP(y) as a native block does."""
    hooks = hooks_for(layer)
    if hooks is None or "hook_resid_mid" not in hooks:
        return None
    seen = _stream_view(layer, x)
    y = hooks("hook_resid_mid", seen)
    if y is seen:
        return None
    _DELTAS.set({**(_DELTAS.get() or {}), id(layer): y - seen})
    return y.reshape(x.shape)


def _resid_post(layer: nn.Module, out: Any) -> Any:
    """The layer's output, with a replaced resid_mid's difference added, shown at
    hook_resid_post."""
    hooks = hooks_for(layer)
    if hooks is None:
        return None
    deltas = dict(_DELTAS.get() or {})
    delta = deltas.pop(id(layer), None)
    if delta is not None:
        _DELTAS.set(deltas)
        x = _first(out)
        out = _with_first(out, x + delta.reshape(x.shape))
    shown = show(layer, "hook_resid_post", out)
    return out if shown is None and delta is not None else shown


def alias_plan(
    root: nn.Module, path: str, last: str, *, keep_path: bool = False
) -> list[tuple[nn.Module, str, str]]:
    """(module, child, alias) for every step of `path` below `root`: the last named `last`,
    the others transparent ("") or, with `keep_path`, under their own names."""
    steps = path.split(".")
    plan, module = [], root
    for i, step in enumerate(steps):
        alias = last if i == len(steps) - 1 else (step if keep_path else "")
        plan.append((module, step, alias))
        module = module.get_submodule(step)
    return plan


def apply_aliases(plan: list[tuple[nn.Module, str, str]]) -> None:
    for module, child, alias in plan:
        current = dict(getattr(module, "hook_alias", {}))
        if current.get(child, alias) != alias:
            raise BridgeError(
                f"{type(module).__name__}.{child} would be named both {current[child]!r} and "
                f"{alias!r} by the bridge's hook names"
            )
        current[child] = alias
        setattr(module, "hook_alias", current)  # noqa: B010 (an nn.Module's plain attribute)


def attention_points(attn: nn.Module, out_proj: nn.Linear | None, heads: int, kv: int) -> None:
    points = ATTENTION_HOOK_POINTS if out_proj is not None else ATTENTION_HOOK_POINTS[:-1]
    setattr(attn, "hook_points", points)  # noqa: B010
    for name, value in (("num_heads", heads), ("num_kv_heads", kv)):
        have = getattr(attn, name, None)
        if have is None:
            setattr(attn, name, value)
        elif have != value:
            raise BridgeError(f"{type(attn).__name__}.{name} is {have}, the config says {value}")


def _owner(module: nn.Module) -> nn.Module:
    return module.__dict__["_multihead_owner"][0]


def set_owner(site: nn.Module, owner: nn.Module) -> None:
    """The module whose hook points a torch hook on `site` serves. Kept in a list, a plain
    attribute (not a child module), so `copy.deepcopy` of the model maps it to the copy's
    owner: the hooks hold no module themselves."""
    have = getattr(site, "_multihead_owner", None)
    if have is not None and have[0] is not owner:
        raise BridgeError(f"{type(site).__name__} would serve the hook points of two modules")
    object.__setattr__(site, "_multihead_owner", [owner])


def shows(point: str) -> Any:
    """A forward hook showing the output at `point` of the site's owner."""
    return lambda module, args, out: show(_owner(module), point, out)


def install_result(attn: nn.Module, out_proj: nn.Linear, heads: int) -> Any:
    """hook_result at the output projection: each head's slice of its input times its columns."""

    def result(module: Any, args: tuple, out: Tensor) -> Tensor | None:
        hooks = hooks_for(_owner(module))
        if hooks is None or "hook_result" not in hooks:
            return None
        z = args[0]
        B, T = z.shape[0], z.shape[1]
        z = z.reshape(B, T, heads, -1).transpose(1, 2)  # (B, T, H * Dv) -> (B, H, T, Dv)
        return head_results(z, module.weight, module.bias, hooks)

    set_owner(out_proj, attn)
    return out_proj.register_forward_hook(result)


def _resid_pre(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    hooks = hooks_for(module)
    if hooks is None:
        return None
    x = args[0] if args else kwargs["hidden_states"]
    _SHAPES.set({**(_SHAPES.get() or {}), id(module): tuple(x.shape)})  # see _stream_view
    if id(module) in (_DELTAS.get() or {}):  # left by a forward that raised
        _DELTAS.set({k: v for k, v in (_DELTAS.get() or {}).items() if k != id(module)})
    if "hook_resid_pre" not in hooks:
        return None
    if args:
        return (hooks("hook_resid_pre", args[0]), *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hooks("hook_resid_pre", kwargs["hidden_states"])}


def _mid_input(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    layer = _owner(module)
    if args:
        y = _mid(layer, args[0])
        return None if y is None else ((y, *args[1:]), kwargs)
    key = next(iter(kwargs))
    y = _mid(layer, kwargs[key])
    return None if y is None else (args, {**kwargs, key: y})


def install_layer(parts: LayerParts) -> list[Any]:
    """The torch hooks that serve a layer's hook points (each site told its owner, the layer)."""
    layer = parts.layer
    handles = [layer.register_forward_pre_hook(_resid_pre, with_kwargs=True)]
    sites: list[tuple[nn.Module, str]] = [(parts.attn, "hook_attn_out")]
    if parts.cross is not None:
        sites.append((parts.cross, "hook_cross_attn_out"))
    if parts.mid is not None:
        kind, where = parts.mid
        set_owner(where, layer)
        if kind == "sublayer":
            sites.append((where, "hook_resid_mid"))
        else:
            handles.append(where.register_forward_pre_hook(_mid_input, with_kwargs=True))
    if parts.cross_mid is not None:
        sites.append((parts.cross_mid, "hook_resid_mid_cross"))
    sites.append((parts.mlp, "hook_mlp_out"))
    for site, point in sites:
        set_owner(site, layer)
        handles.append(site.register_forward_hook(shows(point)))
    handles.append(layer.register_forward_hook(lambda m, a, o: _resid_post(m, o)))
    return handles


def layer_points(parts: LayerParts) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(hook_points, hook_order) of a layer."""
    attn_child = parts.attn_path.split(".")[0]
    mlp_child = parts.mlp_path.split(".")[0]
    points = ["hook_resid_pre", "hook_attn_out"]
    points += ["hook_resid_mid"] if parts.mid is not None else []
    points += ["hook_cross_attn_out"] if parts.cross is not None else []
    points += ["hook_resid_mid_cross"] if parts.cross_mid is not None else []
    points += ["hook_mlp_out", "hook_resid_post"]
    order = ["hook_resid_pre", attn_child, *points[1:-2], mlp_child, *points[-2:]]
    return tuple(points), tuple(dict.fromkeys(order))
