"""Hooks on named activations, TransformerLens-style: read them, cache them, replace them.

    out, cache = run_with_cache(model, ids)                  # every activation, by name
    cache["pattern", 1]                                      # = cache["blocks.1.attn.hook_pattern"]
    out = run_with_hooks(model, ids, fwd_hooks=[("blocks.0.attn.hook_z", ablate)])
    with hooks(model, [(lambda name: name.endswith("hook_z"), fn)]):
        model(ids)                                           # a context manager form

Names: `hook_names(model)` lists them (`hook_embed`, `hook_pos_embed`, `blocks.{i}.hook_resid_pre`,
`blocks.{i}.ln1.hook_scale`, `hook_normalized`, `blocks.{i}.attn.hook_q` ... `hook_z`,
`hook_result`, `blocks.{i}.hook_attn_out`, `hook_resid_mid`, `blocks.{i}.ln2.*`,
`blocks.{i}.mlp.hook_pre`, `hook_post` (gated: `hook_pre_linear`), `hook_mlp_out`,
`hook_resid_post`, `ln_final.hook_scale`, `ln_final.hook_normalized`, `hook_logits`;
cross-attention blocks have `blocks.{i}.cross_attn.*`). A hook is `fn(activation, name)`: it
returns None to read, or a tensor of the same shape to replace the activation.

Hooks live only inside the call (or `with` block) that set them, only in this thread (context),
and only on the model given: see `multihead.hook_points`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ..hook_points import HookFn, HookSession, hook_point_names

# ActivationCache and act_name are the hook tools' too (imported from here by the others)
from .activation_cache import ActivationCache as ActivationCache
from .activation_cache import act_name as act_name
from .steps import call_target, combine, ran

NameFilter = str | Sequence[str] | Callable[[str], bool] | None

# Computed only when asked by name (each head's (B, T, H, C) contribution is large; the
# per-head attention inputs route the layer through a per-head projection).
ON_REQUEST = ("hook_result", "hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input")
# Selected by their names only, never by a predicate: hooking them changes how the layer runs
# (ln1's hooks then see per-head shapes), which `lambda n: n.startswith("blocks.7.")` should not.
BY_NAME_ONLY = ON_REQUEST[1:]


def unwrap(model: nn.Module) -> nn.Module:
    """The eager module behind `torch.compile(model)`: hooks observe eager forwards only."""
    return getattr(model, "_orig_mod", model)


def eager_only(model: nn.Module, what: str) -> nn.Module:
    """`model`, for a `with` block that observes the calls made inside it. A torch.compile
    wrapper is refused: its graphs were traced without hooks, so calling it inside the block
    would run unobserved (a silent no-op)."""
    if hasattr(model, "_orig_mod"):
        raise TypeError(
            f"{what} got a torch.compile(...) model, whose compiled graphs carry no hooks: "
            "calling it inside the block would run unobserved. Pass model._orig_mod and call "
            "that inside the block (run_with_cache and run_with_hooks do this themselves)"
        )
    return model


def hook_names(model: nn.Module) -> list[str]:
    """Every hook point name of `model`, in forward order."""
    return [name for name, _, _ in hook_point_names(unwrap(model))]


def _select(model: nn.Module, names: NameFilter, *, default_all: bool) -> list[str]:
    """The hook names a filter selects; unknown names raise with suggestions."""
    every = hook_names(model)
    if names is None:
        return [n for n in every if not n.endswith(ON_REQUEST)] if default_all else []
    if callable(names):
        return [n for n in every if names(n) and not n.endswith(BY_NAME_ONLY)]
    wanted = [names] if isinstance(names, str) else list(names)
    known = set(every)
    for n in wanted:
        if not isinstance(n, str):
            raise TypeError(f"hook names must be strings, got {type(n).__name__}")
        if n not in known:
            close = difflib.get_close_matches(n, every, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{type(model).__name__} has no hook point {n!r}{hint}")
    return wanted


def _resolve(
    model: nn.Module, fwd_hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]]
) -> list[tuple[str, HookFn]]:
    resolved: list[tuple[str, HookFn]] = []
    for entry in fwd_hooks:
        if not (isinstance(entry, tuple) and len(entry) == 2 and callable(entry[1])):
            raise TypeError(f"fwd_hooks holds (name or predicate, fn) pairs, got {entry!r}")
        name, fn = entry
        resolved += [(n, fn) for n in _select(model, name, default_all=False)]
    return resolved


@contextmanager
def hooks(
    model: nn.Module, fwd_hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]]
) -> Iterator[None]:
    """Run `fwd_hooks` on `model`'s forwards inside the block (this thread/context only)."""
    model = eager_only(model, "hooks()")
    session = HookSession(model, _resolve(model, fwd_hooks), writes=True)
    with session.active():
        yield


def run_with_hooks(
    model: nn.Module,
    *inputs: Any,
    fwd_hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]] = (),
    **kwargs: Any,
) -> Any:
    """`model(*inputs, **kwargs)` with `fwd_hooks`: [(name or predicate, fn(activation, name))].
    A torch.compile(...) model runs its eager module (compiled graphs carry no hooks).
    `model` may be a bound method (`model.generate`, `encoder.encode`): see `hooked.steps`."""
    module, call = call_target(model, unwrap)
    with hooks(module, fwd_hooks):
        return ran(call(*inputs, **kwargs), call)


def run_with_cache(
    model: nn.Module,
    *inputs: Any,
    names: NameFilter = None,
    device: torch.device | str | None = None,
    names_filter: NameFilter = None,
    ungroup_grouped_query_attention: bool = False,
    **kwargs: Any,
) -> tuple[Any, ActivationCache]:
    """`model(*inputs, **kwargs)` and a cache of its activations, detached.

    `names` (or `names_filter`, TransformerLens' spelling): a name, a list of names or a
    predicate; default every hook point except those computed on request (`hook_result`, and
    `hook_attn_in`, `hook_q_input`, `hook_k_input`, `hook_v_input`, which a predicate never
    selects either: ask for them by name).
    `device`: where to keep them (default: where they are). `ungroup_grouped_query_attention`:
    store hook_k, hook_v and hook_rot_k per query head (B, T, H, D), each query head's copy of
    the key/value head it reads, instead of per key/value head (B, T, Hkv, D) (TransformerLens'
    config flag of that name; the model computes with the grouped heads either way).
    The model computes exactly what it computes without the cache. `model` may be a bound
    method that runs the model several times: `model.generate` gives one cache over the
    generated sequence, `encoder.encode` a list of caches, one per text (see `hooked.steps`).
    """
    if names is not None and names_filter is not None:
        raise TypeError("run_with_cache got both names and names_filter (the same argument)")
    model, call = call_target(model, unwrap)
    selected = _select(model, names if names_filter is None else names_filter, default_all=True)
    store: dict[str, list[Tensor]] = {}
    repeats = _kv_repeats(model) if ungroup_grouped_query_attention else {}

    def save(activation: Tensor, name: str) -> None:
        if name in repeats:  # (B, T, Hkv, D) -> (B, T, H, D): query head h reads kv head h // r
            activation = activation.repeat_interleave(repeats[name], dim=2)
        kept = activation.detach() if device is None else activation.detach().to(device)
        store.setdefault(name, []).append(kept)

    session = HookSession(model, [(n, save) for n in selected], writes=False)
    with session.active():
        out = ran(call(*inputs, **kwargs), call)
    return out, combine(call, store, model)


def _kv_repeats(model: nn.Module) -> dict[str, int]:
    """Hook name -> query heads per key/value head, for the key/value points of grouped
    attention modules."""
    repeats = {}
    for name, module, point in hook_point_names(model):
        groups = getattr(module, "num_heads", 1) // getattr(module, "num_kv_heads", 1)
        if point in ("hook_k", "hook_v", "hook_rot_k") and groups > 1:
            repeats[name] = groups
    return repeats
