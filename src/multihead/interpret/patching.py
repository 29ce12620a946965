"""Activation patching: which activations carry the difference between a clean and a corrupted
input?

    result = patch(model, clean_ids, corrupted_ids, metric)     # metric(output) -> scalar
    result.heads          # (L, H): fraction of the clean-vs-corrupted difference recovered
    print(result)         # the heads that recover most, as a table

For each activation, the corrupted input is run with that one activation taken from the clean
run, and the metric is read: recovered = (metric(patched) - metric(corrupted)) /
(metric(clean) - metric(corrupted)). 1 means the activation alone restores the clean behaviour,
0 that it carries none of the difference. Heads are patched through `hook_z` (each head's output
before the output projection), at every position, or one position at a time with
`head_positions=True`; residual streams (`resid=("resid_pre", "resid_post")`) one block and one
position at a time. One forward pass per patched activation, without gradients.

Shapes: clean and corrupted inputs alike (B, T); heads (L, H); head_positions (L, H, T);
resid[name] (L, T). L counts attention modules as `head_gates` rows do (blocks for CausalLM,
BERT and Encoder stacks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..table import format_table
from .ablation import replace_heads
from .hooks import act_name, hook_names, run_with_cache, run_with_hooks, unwrap
from .metric_checks import check_metric_pair
from .scope import attention_hook_names

Metric = Callable[[Any], "Tensor | float"]


@dataclass(frozen=True)
class PatchResult:
    """Fractions recovered (see the module docstring) and the two metrics they are relative to."""

    clean: float
    corrupted: float
    heads: Tensor | None  # (L, H)
    head_positions: Tensor | None = None  # (L, H, T)
    resid: dict[str, Tensor] = field(default_factory=dict)  # name -> (L, T)
    layer_names: tuple[str, ...] = ()  # the hook_z name of each row of `heads`

    def table(self, top: int = 10) -> str:
        """The `top` heads (and residual positions) by |fraction recovered|, largest first."""
        lines = [f"metric: clean {self.clean:.4g}, corrupted {self.corrupted:.4g}"]
        entries: list[tuple[str, float]] = []
        if self.heads is not None:
            entries += [
                (f"L{layer} H{head}", float(self.heads[layer, head]))
                for layer in range(self.heads.shape[0])
                for head in range(self.heads.shape[1])
            ]
        for name, grid in self.resid.items():
            entries += [
                (f"{name} L{layer} pos {pos}", float(grid[layer, pos]))
                for layer in range(grid.shape[0])
                for pos in range(grid.shape[1])
            ]
        entries.sort(key=lambda e: -abs(e[1]))
        rows = [[where, f"{value:.3f}"] for where, value in entries[:top]]
        lines.append(format_table(["patched", "recovered"], rows))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _as_inputs(x: Any) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _value(metric: Metric, out: Any) -> float:
    value = metric(out)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"metric must return a scalar, got a tensor of shape {tuple(value.shape)} "
                "(average it over the batch)"
            )
        return float(value.detach())
    return float(value)


def _patch_positions(clean: Tensor, position: int) -> Callable[[Tensor, str], Tensor]:
    """A hook that takes position `position` (dim 1) of the activation from `clean`."""

    def fn(activation: Tensor, name: str) -> Tensor:
        out = activation.clone()
        out[:, position] = clean[:, position]
        return out

    return fn


def patch(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    *,
    heads: bool = True,
    head_positions: bool = False,
    resid: str | Sequence[str] = (),
    **kwargs: Any,
) -> PatchResult:
    """Patch activations of the clean run into the corrupted run, one at a time.

    `clean`, `corrupted`: the model's input (a tensor, or a tuple of positional inputs) of the
    same shapes; `kwargs` go to every call (e.g. `attention_mask`). `metric(output)` -> a
    scalar (a tensor or float), e.g. the logit difference of the right and wrong answer.
    `heads`: patch each head's hook_z at every position -> `.heads` (L, H).
    `head_positions`: also each head at each position -> `.head_positions` (L, H, T).
    `resid`: "resid_pre" and/or "resid_post": each block's residual stream at each position
    -> `.resid[name]` (L, T).
    Raises ValueError when the metric is the same on both inputs (nothing to recover) or NaN or
    infinite on either (`metric_checks.check_metric_pair`).
    """
    model = unwrap(model)
    clean_in, corrupted_in = _as_inputs(clean), _as_inputs(corrupted)
    for a, b in zip(clean_in, corrupted_in, strict=False):
        if isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape != b.shape:
            raise ValueError(
                f"clean {tuple(a.shape)} and corrupted {tuple(b.shape)} inputs must have the "
                "same shape (patching aligns their positions)"
            )
    streams = [resid] if isinstance(resid, str) else list(resid)
    for name in streams:
        if name not in ("resid_pre", "resid_post"):
            raise ValueError(f"resid names 'resid_pre' and/or 'resid_post', got {name!r}")
    rows = attention_hook_names(model, "hook_z")
    known = set(hook_names(model))
    blocks = 0
    while act_name("resid_pre", blocks) in known:
        blocks += 1
    if streams and blocks == 0:
        raise ValueError(f"{type(model).__name__} has no blocks.{{i}}.hook_resid_* hook points")

    wanted = [name for name, _ in rows] if heads or head_positions else []
    wanted += [act_name(s, i) for s in streams for i in range(blocks)]
    with torch.no_grad():
        clean_out, cache = run_with_cache(model, *clean_in, names=wanted, **kwargs)
        clean_value = _value(metric, clean_out)
        corrupted_value = _value(metric, model(*corrupted_in, **kwargs))
        difference = check_metric_pair(clean_value, corrupted_value)

        def recovered(fwd_hooks: list) -> float:
            out = run_with_hooks(model, *corrupted_in, fwd_hooks=fwd_hooks, **kwargs)
            return (_value(metric, out) - corrupted_value) / difference

        def head_grid(by_position: bool) -> Tensor:
            H = max(count for _, count in rows)
            T = cache[rows[0][0]].shape[1] if rows else 0
            grid = torch.full((len(rows), H, T) if by_position else (len(rows), H), float("nan"))
            for layer, (name, count) in enumerate(rows):
                clean_z = cache[name]  # (B, T, H, D)
                for head in range(count):
                    value = clean_z[:, :, [head]]
                    if by_position:
                        for pos in range(T):
                            fn = replace_heads([head], value, positions=[pos])
                            grid[layer, head, pos] = recovered([(name, fn)])
                    else:
                        grid[layer, head] = recovered([(name, replace_heads([head], value))])
            return grid

        head_result = head_grid(False) if heads else None
        head_pos_result = head_grid(True) if head_positions else None
        resid_result: dict[str, Tensor] = {}
        for stream in streams:
            T = cache[act_name(stream, 0)].shape[1]
            grid = torch.empty(blocks, T)
            for layer in range(blocks):
                name = act_name(stream, layer)
                for pos in range(T):
                    grid[layer, pos] = recovered([(name, _patch_positions(cache[name], pos))])
            resid_result[stream] = grid
    return PatchResult(
        clean_value,
        corrupted_value,
        head_result,
        head_pos_result,
        resid_result,
        tuple(name for name, _ in rows),
    )
