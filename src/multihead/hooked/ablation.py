"""Head ablation: replace chosen heads' outputs (`hook_z`, before the output projection) by zero,
by their mean over a reference batch, or by their values on another input; at every position or
at chosen ones. Each builder returns `fwd_hooks` for `run_with_hooks` / `hooks`; `ablate` is the
context-manager form.

    logits = run_with_hooks(model, ids, fwd_hooks=zero_ablation(model, [(1, 3)]))
    with ablate(model, [(1, 3), (0, 2)], "mean", reference=other_ids):
        logits = model(ids)

Heads are (layer, head) pairs; layer indexes the model's attention modules in the order of
`attention_modules` / `head_gates` rows (block i for CausalLM, BERT and Encoder stacks).

Shapes: z (B, T, H, D) as hooks show it (packed input: (1, N, H, D), positions index the N
packed tokens); a per-head value (H, D), per position (T, H, D) or per example (B, T, H, D).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ..hook_points import HookFn
from .hooks import hooks, run_with_cache, unwrap
from .scope import attention_hook_names

Heads = Iterable[tuple[int, int]]
Positions = int | Sequence[int] | Tensor | None
FwdHooks = list[tuple[str, HookFn]]


def group_heads(model: nn.Module, heads: Heads) -> dict[str, list[int]]:
    """{hook_z name: [head, ...]} for (layer, head) pairs, checked against the model."""
    rows = attention_hook_names(unwrap(model), "hook_z")
    grouped: dict[str, list[int]] = {}
    for pair in heads:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(type(x) is int for x in pair)):
            raise TypeError(f"heads holds (layer, head) pairs of ints, got {pair!r}")
        layer, head = pair
        if not 0 <= layer < len(rows):
            raise ValueError(f"layer {layer} is out of range: the model has {len(rows)} layers")
        name, count = rows[layer]
        if not 0 <= head < count:
            raise ValueError(f"head {head} is out of range: layer {layer} has {count} heads")
        if head not in grouped.setdefault(name, []):
            grouped[name].append(head)
    if not grouped:
        raise ValueError("heads is empty: name at least one (layer, head) pair")
    return grouped


def _check_positions(positions: Positions) -> list[int] | Tensor | None:
    """None (all), a list of ints, or a boolean mask tensor."""
    if positions is None or (isinstance(positions, Tensor) and positions.dtype == torch.bool):
        return positions
    if isinstance(positions, Tensor):
        if positions.is_floating_point() or positions.dim() > 1:
            raise TypeError(f"positions must be ints or a boolean mask, got {positions.dtype}")
        return [int(p) for p in positions.reshape(-1).tolist()]
    if isinstance(positions, int) and not isinstance(positions, bool):
        return [positions]
    if isinstance(positions, Sequence) and all(
        isinstance(p, int) and not isinstance(p, bool) for p in positions
    ):
        return list(positions)
    raise TypeError(
        f"positions must be an int, a sequence of ints or a boolean mask, got {positions!r}"
    )


def _where(positions: list[int] | Tensor | None, z: Tensor) -> Tensor | None:
    """A boolean (B or 1, T) selection of z's positions, or None for all of them."""
    if positions is None:
        return None
    B, T = z.shape[:2]
    if isinstance(positions, Tensor):
        if positions.dim() not in (1, 2) or positions.shape[-1] != T:
            raise ValueError(
                f"a boolean positions mask must be (T,) or (B, T) with T = {T}, "
                f"got {tuple(positions.shape)}"
            )
        return positions.to(z.device).expand(B, T) if positions.dim() == 2 else positions[None]
    outside = [p for p in positions if not -T <= p < T]
    if outside:
        raise ValueError(f"positions {outside} are out of range for {T} positions")
    where = torch.zeros(T, dtype=torch.bool, device=z.device)
    where[torch.tensor(positions, dtype=torch.long, device=z.device)] = True
    return where[None]  # (1, T)


def replace_heads(heads: list[int], value: Tensor | float, positions: Positions = None) -> HookFn:
    """A hook_z hook that sets `heads` to `value` (broadcast to (B, T, len(heads), D)), at
    `positions` (ints, negative allowed, or a boolean (T,) / (B, T) mask; None = all)."""
    selected = _check_positions(positions)

    def fn(z: Tensor, name: str) -> Tensor:
        index = torch.tensor(heads, device=z.device)
        current = z[:, :, index]  # (B, T, k, D)
        new = torch.as_tensor(value, dtype=z.dtype, device=z.device)
        try:
            new = new.expand_as(current)
        except RuntimeError:
            raise ValueError(
                f"{name}: the replacement for heads {heads} has shape {tuple(new.shape)}, which "
                f"does not broadcast to the activation's {tuple(current.shape)} (B, T, heads, D)"
            ) from None
        where = _where(selected, z)
        if where is not None:
            new = torch.where(where[:, :, None, None], new, current)
        out = z.clone()
        out[:, :, index] = new
        return out

    return fn


def zero_ablation(model: nn.Module, heads: Heads, *, positions: Positions = None) -> FwdHooks:
    """Hooks that zero the heads' outputs (at `positions`)."""
    return [(n, replace_heads(hs, 0.0, positions)) for n, hs in group_heads(model, heads).items()]


def _inputs(inputs: Any) -> tuple:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def _head_values(model: nn.Module, grouped: dict[str, list[int]], inputs: Any, kwargs) -> dict:
    """hook_z of the grouped heads on `inputs`: {name: (B', T', k, D)}."""
    with torch.no_grad():
        _, cache = run_with_cache(model, *_inputs(inputs), names=list(grouped), **kwargs)
    return {name: cache[name][:, :, hs] for name, hs in grouped.items()}


def mean_ablation(
    model: nn.Module,
    heads: Heads,
    reference: Any,
    *,
    positions: Positions = None,
    per_position: bool = False,
    reference_mask: Tensor | None = None,
    **kwargs: Any,
) -> FwdHooks:
    """Hooks that set the heads' outputs to their mean over a reference batch.

    `reference`: the model's input (a tensor, or a tuple of positional inputs) for the reference
    run, with `kwargs`. The mean is over examples and positions, one (D,) vector per head; with
    `per_position=True`, over examples only, (T, D) per head, and the ablated input must have
    the reference's length. `reference_mask` (B', T'), True/1 = a real token, leaves padding out
    of the mean.
    """
    grouped = group_heads(model, heads)
    values = _head_values(model, grouped, reference, kwargs)
    hooks_: FwdHooks = []
    for name, z in values.items():  # z (B', T', k, D)
        if reference_mask is None:
            weight = torch.ones(z.shape[:2], dtype=z.dtype, device=z.device)
        else:
            if tuple(reference_mask.shape) != tuple(z.shape[:2]):
                raise ValueError(
                    f"reference_mask must be (B, T) = {tuple(z.shape[:2])}, got "
                    f"{tuple(reference_mask.shape)}"
                )
            weight = reference_mask.to(z.device, z.dtype)
        w = weight[:, :, None, None]
        if per_position:
            mean = (z * w).sum(0) / w.sum(0).clamp(min=1)  # (T', k, D)
        else:
            mean = (z * w).sum((0, 1)) / w.sum().clamp(min=1)  # (k, D)
        hooks_.append((name, replace_heads(grouped[name], mean, positions)))
    return hooks_


def resample_ablation(
    model: nn.Module, heads: Heads, source: Any, *, positions: Positions = None, **kwargs: Any
) -> FwdHooks:
    """Hooks that set the heads' outputs to their values on another input, `source` (a tensor
    or a tuple of positional inputs, with `kwargs`), of the ablated input's shape (or batch 1)."""
    grouped = group_heads(model, heads)
    values = _head_values(model, grouped, source, kwargs)
    return [(n, replace_heads(grouped[n], v, positions)) for n, v in values.items()]


@contextmanager
def ablate(
    model: nn.Module,
    heads: Heads,
    method: str = "zero",
    *,
    reference: Any = None,
    positions: Positions = None,
    per_position: bool = False,
    reference_mask: Tensor | None = None,
    **kwargs: Any,
) -> Iterator[None]:
    """Ablate `heads` of `model` inside the block (this thread / context only).

    `method`: "zero", "mean" (over `reference`, see `mean_ablation`) or "resample" (from
    `reference`, see `resample_ablation`); `kwargs` go to the reference run.
    """
    if method == "zero":
        fwd_hooks = zero_ablation(model, heads, positions=positions)
    elif method in ("mean", "resample"):
        if reference is None:
            raise ValueError(f"{method} ablation needs reference= (the model's input)")
        if method == "mean":
            fwd_hooks = mean_ablation(
                model,
                heads,
                reference,
                positions=positions,
                per_position=per_position,
                reference_mask=reference_mask,
                **kwargs,
            )
        else:
            fwd_hooks = resample_ablation(model, heads, reference, positions=positions, **kwargs)
    else:
        raise ValueError(f"unknown ablation method {method!r}; choose 'zero', 'mean' or 'resample'")
    with hooks(model, fwd_hooks):
        yield
