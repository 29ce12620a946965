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
`head_positions=True`; each head's query and key (`qk=("q", "k")`: hook_q per query head,
hook_k per key/value head, so under grouped-query attention a key node is a kv head read by
H / Hkv query heads) at every position, or one position at a time with `head_positions=True`;
residual streams (`resid=("resid_pre", "resid_post")`) one block and one position at a time,
without gradients. Two engines give the same fractions: the batched one
(default for a CausalLM in eval mode: many patches per forward, the unchanged prefix of layers
run once; `patch_batched.py`) and the loop (one whole forward per patch, any model). Inside a
context that holds hooks on the model (`hooks()`, `capture`, `head_gates`), "auto" takes the loop,
which runs every forward under those hooks, and engine="batched" is refused naming them. For an
estimate of every patch from one forward and one backward, see `attribution_patch`.

Shapes: clean and corrupted inputs alike (B, T); heads (L, H); head_positions (L, H, T);
qk["q"] (L, H), qk["k"] (L, Hkv), qk["q_positions"] (L, H, T), qk["k_positions"] (L, Hkv, T);
resid[name] (L, T). L counts attention modules as `head_gates` rows do (blocks for CausalLM,
BERT and Encoder stacks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..modules.lm import CausalLM
from ..table import format_table
from .ablation import replace_heads
from .hooks import act_name, hook_names, run_with_cache, run_with_hooks, unwrap
from .metric_checks import check_metric_pair
from .patch_batched import BatchedPatcher, batched_refusal
from .scope import attention_hook_names, attention_modules

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
    # "q", "k" -> (L, H) / (L, Hkv); "q_positions", "k_positions" -> (L, H or Hkv, T)
    qk: dict[str, Tensor] = field(default_factory=dict)
    note: str = ""  # what the values are, where an estimate made them (shown by table())

    def sections(self) -> list[str]:
        """The kinds of patch this result holds: "heads", "head_positions", its query/key
        nodes ("q", "k", "q_positions", "k_positions"), then its streams."""
        kinds = [k for k in ("heads", "head_positions") if getattr(self, k) is not None]
        return kinds + list(self.qk) + list(self.resid)

    def _entries(self, kind: str) -> list[tuple[str, float]]:
        if kind == "heads" and self.heads is not None:
            L, H = self.heads.shape
            return [(f"L{i} H{h}", float(self.heads[i, h])) for i in range(L) for h in range(H)]
        if kind == "head_positions" and self.head_positions is not None:
            L, H, T = self.head_positions.shape
            grid = self.head_positions
            return [
                (f"L{i} H{h} pos {p}", float(grid[i, h, p]))
                for i in range(L)
                for h in range(H)
                for p in range(T)
            ]
        if kind in self.qk:
            grid, point = self.qk[kind], kind[0]
            label = "H" if point == "q" else "KV"
            if grid.dim() == 2:
                return [
                    (f"{point} L{i} {label}{h}", float(grid[i, h]))
                    for i in range(grid.shape[0])
                    for h in range(grid.shape[1])
                ]
            return [
                (f"{point} L{i} {label}{h} pos {p}", float(grid[i, h, p]))
                for i in range(grid.shape[0])
                for h in range(grid.shape[1])
                for p in range(grid.shape[2])
            ]
        if kind in self.resid:
            grid = self.resid[kind]
            return [
                (f"{kind} L{i} pos {p}", float(grid[i, p]))
                for i in range(grid.shape[0])
                for p in range(grid.shape[1])
            ]
        raise ValueError(f"kind must be one of {self.sections()}, got {kind!r}")

    def table(self, top: int = 10, kind: str | Sequence[str] | None = None) -> str:
        """The `top` entries by |fraction recovered|, largest first, in one section per kind
        (heads, heads by position, each residual stream), so that one kind cannot crowd out
        another; `kind` shows only the kinds named (see `sections()`)."""
        kinds = self.sections() if kind is None else [kind] if isinstance(kind, str) else kind
        lines = [f"metric: clean {self.clean:.4g}, corrupted {self.corrupted:.4g}"]
        if self.note:
            lines.append(self.note)
        for k in kinds:
            entries = sorted(self._entries(k), key=lambda e: -abs(e[1]))
            rows = [[where, f"{value:.3f}"] for where, value in entries[:top]]
            lines += ["", format_table([f"patched ({k})", "recovered"], rows)]
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


def _names_asked(argument: str, value: str | Sequence[str], allowed: tuple[str, ...]) -> list[str]:
    """`value` (one name or several) as a list, each checked to be one of `allowed`."""
    names = [value] if isinstance(value, str) else list(value)
    for name in names:
        if name not in allowed:
            choices = " and/or ".join(repr(a) for a in allowed)
            raise ValueError(f"{argument} names {choices}, got {name!r}")
    return names


def resid_streams(resid: str | Sequence[str]) -> list[str]:
    """The residual streams asked for ("resid_pre" and/or "resid_post"), checked."""
    return _names_asked("resid", resid, ("resid_pre", "resid_post"))


def block_count(known: set[str]) -> int:
    """How many blocks have a hook_resid_pre among the hook names `known`."""
    blocks = 0
    while act_name("resid_pre", blocks) in known:
        blocks += 1
    return blocks


def qk_points(qk: str | Sequence[str]) -> list[str]:
    """The query/key points asked for ("q" and/or "k"), checked."""
    return list(dict.fromkeys(_names_asked("qk", qk, ("q", "k"))))


def qk_rows(model: nn.Module, point: str) -> list[tuple[str, int]]:
    """(hook name, heads) of every attention module's hook_q or hook_k: query heads for "q",
    key/value heads for "k" (hook_k holds Hkv heads under grouped-query attention)."""
    rows = attention_hook_names(model, f"hook_{point}")
    if point == "q":
        return rows
    modules = attention_modules(model)
    return [
        (name, int(getattr(m, "num_kv_heads", None) or count))
        for (name, count), (_, m) in zip(rows, modules, strict=True)
    ]


def patch(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    *,
    heads: bool = True,
    head_positions: bool = False,
    resid: str | Sequence[str] = (),
    qk: str | Sequence[str] = (),
    engine: str = "auto",
    batch_size: int | None = None,
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
    `qk`: "q" and/or "k": each head's query (hook_q) / each key-value head's key (hook_k) at
    every position -> `.qk["q"]` (L, H), `.qk["k"]` (L, Hkv); with `head_positions`, also one
    position at a time -> `.qk["q_positions"]`, `.qk["k_positions"]` (L, H or Hkv, T).
    `engine`: "batched" runs many patches per forward and the unchanged prefix of layers
    once (see `patch_batched`; CausalLM in eval mode, input_ids plus an optional
    attention_mask); "loop" runs one whole forward per patch; "auto" (default) takes "batched"
    where it can run (not inside a context holding hooks on the model: the loop then runs every
    forward under them). Both give the same fractions up to float rounding. `batch_size`: patches
    per batched forward (default: as many as keep the logits near 256 MB).
    Raises ValueError when the metric is the same on both inputs (nothing to recover) or NaN or
    infinite on either (`metric_checks.check_metric_pair`).
    """
    model = unwrap(model)
    if engine not in ("auto", "batched", "loop"):
        raise ValueError(f"engine must be 'auto', 'batched' or 'loop', got {engine!r}")
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    clean_in, corrupted_in = _as_inputs(clean), _as_inputs(corrupted)
    for a, b in zip(clean_in, corrupted_in, strict=False):
        if isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape != b.shape:
            raise ValueError(
                f"clean {tuple(a.shape)} and corrupted {tuple(b.shape)} inputs must have the "
                "same shape (patching aligns their positions)"
            )
    streams = resid_streams(resid)
    points = qk_points(qk)
    rows = attention_hook_names(model, "hook_z")
    point_rows = {point: qk_rows(model, point) for point in points}
    blocks = block_count(set(hook_names(model)))
    if streams and blocks == 0:
        raise ValueError(f"{type(model).__name__} has no blocks.{{i}}.hook_resid_* hook points")
    refusal = batched_refusal(model, clean_in, kwargs)
    if engine == "batched" and refusal is not None:
        raise ValueError(f"engine='batched' cannot run this call: {refusal}")
    use_batched = engine != "loop" and refusal is None

    with torch.no_grad():
        clean_out = model(*clean_in, **kwargs)
        clean_value = _value(metric, clean_out)
        corrupted_value = _value(metric, model(*corrupted_in, **kwargs))
        difference = check_metric_pair(clean_value, corrupted_value)
        if use_batched:
            patcher = BatchedPatcher(
                cast(CausalLM, model),
                clean_in[0],
                corrupted_in[0],
                kwargs.get("attention_mask"),
                lambda out: _value(metric, out),
                batch_size,
                ("z", *points),
            )

            def batched_grid(by_position: bool, point: str = "z") -> Tensor:
                return torch.stack([patcher.heads(i, by_position, point) for i in range(len(rows))])

            head_result = batched_grid(False) if heads else None
            head_pos_result = batched_grid(True) if head_positions else None
            qk_result = {point: batched_grid(False, point) for point in points}
            if head_positions:
                qk_result |= {f"{p}_positions": batched_grid(True, p) for p in points}
            resid_result = {
                stream: torch.stack(
                    [patcher.stream(i + (stream == "resid_post")) for i in range(blocks)]
                )
                for stream in streams
            }

            def fractions(metrics: Tensor | None) -> Any:
                return None if metrics is None else (metrics - corrupted_value) / difference

            head_result, head_pos_result = fractions(head_result), fractions(head_pos_result)
            resid_result = {k: fractions(v) for k, v in resid_result.items()}
            qk_result = {k: fractions(v) for k, v in qk_result.items()}
        else:
            wanted = [name for name, _ in rows] if heads or head_positions else []
            wanted += [name for r in point_rows.values() for name, _ in r]
            wanted += [act_name(s, i) for s in streams for i in range(blocks)]
            _, cache = run_with_cache(model, *clean_in, names=wanted, **kwargs)
            head_result, head_pos_result, resid_result = _loop(
                model, corrupted_in, kwargs, metric, cache, rows, streams, blocks,
                heads, head_positions, corrupted_value, difference,
            )  # fmt: skip
            qk_result = {}
            for point, prow in point_rows.items():
                qk_result[point] = _head_grid(
                    model, corrupted_in, kwargs, metric, cache, prow, False,
                    corrupted_value, difference,
                )  # fmt: skip
            if head_positions:
                for point, prow in point_rows.items():
                    qk_result[f"{point}_positions"] = _head_grid(
                        model, corrupted_in, kwargs, metric, cache, prow, True,
                        corrupted_value, difference,
                    )  # fmt: skip
    return PatchResult(
        clean_value,
        corrupted_value,
        head_result,
        head_pos_result,
        resid_result,
        tuple(name for name, _ in rows),
        qk_result,
    )


def _head_grid(
    model: nn.Module,
    corrupted_in: tuple,
    kwargs: dict[str, Any],
    metric: Metric,
    cache: Any,
    rows: list[tuple[str, int]],
    by_position: bool,
    corrupted_value: float,
    difference: float,
) -> Tensor:
    """The loop engine's grid for the heads of one hook point (hook_z, hook_q or hook_k: each
    (B, T, heads, D)): one forward per head, or per head and position."""
    H = max(count for _, count in rows)
    T = cache[rows[0][0]].shape[1] if rows else 0
    grid = torch.full((len(rows), H, T) if by_position else (len(rows), H), float("nan"))
    for layer, (name, count) in enumerate(rows):
        clean = cache[name]  # (B, T, heads, D)
        for head in range(count):
            value = clean[:, :, [head]]
            positions = range(T) if by_position else [None]
            for pos in positions:
                fn = replace_heads([head], value, None if pos is None else [pos])
                out = run_with_hooks(model, *corrupted_in, fwd_hooks=[(name, fn)], **kwargs)
                fraction = (_value(metric, out) - corrupted_value) / difference
                if pos is None:
                    grid[layer, head] = fraction
                else:
                    grid[layer, head, pos] = fraction
    return grid


def _loop(
    model: nn.Module,
    corrupted_in: tuple,
    kwargs: dict[str, Any],
    metric: Metric,
    cache: Any,
    rows: list[tuple[str, int]],
    streams: list[str],
    blocks: int,
    heads: bool,
    head_positions: bool,
    corrupted_value: float,
    difference: float,
) -> tuple[Tensor | None, Tensor | None, dict[str, Tensor]]:
    """The reference engine: one forward of the whole model per patched activation."""

    def recovered(fwd_hooks: list) -> float:
        out = run_with_hooks(model, *corrupted_in, fwd_hooks=fwd_hooks, **kwargs)
        return (_value(metric, out) - corrupted_value) / difference

    def head_grid(by_position: bool) -> Tensor:
        return _head_grid(
            model, corrupted_in, kwargs, metric, cache, rows, by_position,
            corrupted_value, difference,
        )  # fmt: skip

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
    return head_result, head_pos_result, resid_result
