"""Attribution patching (Nanda 2023; Syed et al. 2023) and AtP* (Kramar, Lieberum, Shah, Nanda
2024, arXiv 2403.00745): every patch of `patch()` estimated at once, from one corrupted forward.

    approx = attribution_patch(model, clean_ids, corrupted_ids, metric, head_positions=True)
    approx.head_positions      # (L, H, T), like patch(...).head_positions
    attribution_patch(..., qk=("q", "k"))    # query / key nodes, AtP*'s QK fix
    attribution_patch(..., grad_drop=True)   # AtP*'s GradDrop: magnitudes

AtP. Patching an activation a from its corrupted value a' to its clean value a changes the
metric by about (a - a') . dmetric/da, the gradient taken at the corrupted run: exact when the
metric is linear in a (e.g. the last block's stream read by a linear metric through a model
without a final norm), an approximation elsewhere. The estimates are divided by metric(clean) -
metric(corrupted), as `patch()`'s fractions are. The gradient with respect to each hooked
activation is the total one (through every later layer): each hook adds a zero tensor that
requires grad, and the gradient is taken with respect to those. Cost: the clean and corrupted
forwards and one backward.

QK fix (`qk` nodes, `qk_fix=True`, the default): a query or key node's effect is taken through
its head's attention pattern recomputed exactly with the clean query / key (`atp_star`), then
linearly in the pattern; `qk_fix=False` estimates them linearly at hook_q / hook_k. Under
grouped-query attention a key node is a key/value head (hook_k's heads), its effect summed over
the query heads that read it. Heads (hook_z) and the residual stream stay linear, as in AtP*.

GradDrop (`grad_drop=True`): instead of one backward, L (one per block), the l-th with block l's
residual contributions (hook_attn_out, hook_mlp_out) cut from the gradient; each estimate is
then sum_l |estimate_l| / (L - 1). A node whose paths cancel in the full gradient (a direct and
an indirect effect of opposite signs) shows once one path is cut. The values are magnitudes
(>= 0): the sign is lost, they rank; `PatchResult.note` and `table()` say so. Cost: the two
forwards and L backwards.

Measured against real `patch()` on SmolLM2-135M-Instruct (`multihead bench patching
--attribution`; docs/toolkit-cache.md has the table, the prompts and the costs). Per head
(hook_z) the plain estimate tracks IOI (r = 0.98) but not the factual-recall prompt (r = 0.68);
GradDrop ranks the fact prompt's heads better (r = 0.88 on magnitudes, 9 of the real top 10)
but not to r >= 0.95; `verify=10` does (r = 0.99, 9 of 10). The QK fix takes query and key
nodes from r = 0.38 / 0.56 (plain, fact) to 0.91 / 0.98. For the residual stream (replacing the
whole stream at one position) no method finds more than 1 of the real top 10, so asking for
`resid` warns. `verify=k` patches the k entries the estimate ranks highest (by |estimate|, per
kind) for real, one forward each, and puts the real (signed) fractions in their place.

Shapes: as `patch()`: heads (L, H), head_positions (L, H, T), qk["q"] (L, H), qk["k"] (L, Hkv),
qk["q_positions"] / qk["k_positions"] (L, H or Hkv, T), resid[name] (L, T).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..hook_points import HookSession
from ..hooked.ablation import replace_heads
from ..hooked.hooks import act_name, hook_names, run_with_cache, run_with_hooks, unwrap
from ..hooked.metric_checks import check_metric_pair
from ..hooked.patching import (
    Metric,
    PatchResult,
    _as_inputs,
    _patch_positions,
    _value,
    block_count,
    qk_points,
    qk_rows,
    resid_streams,
)
from ..hooked.scope import attention_hook_names
from .atp_star import key_effects, query_effects

RESID_WARNING = (
    "attribution_patch on the residual stream is a poor screen: a linear estimate of "
    "replacing the whole stream at one position found 0 and 1 of the real top 10 on "
    "SmolLM2's IOI and factual-recall prompts, with or without GradDrop (see the docs); "
    "confirm with patch(..., resid=...) or pass verify=k to patch the k largest estimates for real"
)


def attribution_patch(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    *,
    heads: bool = True,
    head_positions: bool = False,
    resid: str | Sequence[str] = (),
    qk: str | Sequence[str] = (),
    qk_fix: bool = True,
    grad_drop: bool = False,
    verify: int = 0,
    **kwargs: Any,
) -> PatchResult:
    """Estimate `patch(model, clean, corrupted, metric, ...)` from gradients (see the module
    docstring): the same arguments and result type. `metric(output)` must return a scalar
    tensor that is differentiable in the output.
    `qk`: "q" and/or "k": each head's query / each key-value head's key, as `patch(qk=...)`.
    `qk_fix` (default True): estimate those AtP*'s way, the attention pattern recomputed with
    the clean query or key (`atp_star`); False: linearly at hook_q / hook_k (plain AtP).
    `grad_drop`: AtP*'s GradDrop: one backward per block with that block's residual
    contribution (attention and MLP outputs) cut from the gradient, and every estimate the sum
    of its |values| over the blocks divided by L - 1: magnitudes, the sign is lost (see the
    module docstring). `verify`: patch the `verify` entries of each kind with the largest
    |estimate| for real and report those real (signed) fractions (0: none).
    Asking for `resid` warns: the linear estimate of replacing the whole stream ranks poorly."""
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "attribution_patch needs gradients, and torch.inference_mode() is on: call it "
            "outside inference_mode (torch.no_grad() around it is fine; it enables grad itself)"
        )
    model = unwrap(model)
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise ValueError(f"verify must be a non-negative int, got {verify!r}")
    for flag, given in (("qk_fix", qk_fix), ("grad_drop", grad_drop)):
        if not isinstance(given, bool):
            raise ValueError(f"{flag} must be True or False, got {given!r}")
    clean_in, corrupted_in = _as_inputs(clean), _as_inputs(corrupted)
    streams = resid_streams(resid)
    points = qk_points(qk)
    if streams:
        warnings.warn(RESID_WARNING, UserWarning, stacklevel=2)
    rows = attention_hook_names(model, "hook_z") if heads or head_positions else []
    point_rows = {point: qk_rows(model, point) for point in points}
    known = set(hook_names(model))
    blocks = block_count(known)
    drops = _drop_points(model, known, blocks) if grad_drop else []
    names = [name for name, _ in rows] + [act_name(s, i) for s in streams for i in range(blocks)]
    qk_names = [name for r in point_rows.values() for name, _ in r]
    patterns = [name for name, _ in attention_hook_names(model, "hook_pattern")]
    exact = bool(points) and qk_fix
    prefixes = [name[: -len(".hook_pattern")] for name in patterns]

    clean_calls: dict[str, Any] = {}
    corrupted_calls: dict[str, Any] = {}

    def observer(into: dict[str, Any]) -> Any:
        def fn(prefix: str, call: Any, weights: Tensor) -> None:
            into[prefix] = call._replace(q=call.q.detach(), k=call.k.detach(), v=call.v[:0])

        return fn

    with torch.no_grad():
        session = HookSession(model, observer=observer(clean_calls) if exact else None)
        with session.active():
            clean_out, clean_cache = run_with_cache(
                model, *clean_in, names=names + qk_names, **kwargs
            )
        clean_value = _value(metric, clean_out)
    # The corrupted run, with a zero that requires grad added at every point: its gradient is
    # the metric's total derivative with respect to the activation there.
    zeros: dict[str, Tensor] = {}
    values: dict[str, Tensor] = {}

    def tap(activation: Tensor, name: str) -> Tensor:
        zero = torch.zeros_like(activation, requires_grad=True)
        zeros[name], values[name] = zero, activation.detach()
        return activation + zero

    dropped: dict[str, int | None] = {"block": None}  # the block a backward pass cuts

    def drop(block: int) -> Any:
        def fn(activation: Tensor, name: str) -> Tensor | None:
            if not activation.requires_grad:
                return None
            out = activation.view_as(activation)  # a node of its own, whose gradient is gated
            out.register_hook(lambda g: torch.zeros_like(g) if dropped["block"] == block else None)
            return out

        return fn

    tapped = names + (patterns if exact else qk_names)
    fwd = [(n, tap) for n in tapped] + [(n, drop(b)) for n, b in drops]
    with torch.enable_grad():
        session = HookSession(model, observer=observer(corrupted_calls) if exact else None)
        with session.active():
            out = run_with_hooks(model, *corrupted_in, fwd_hooks=fwd, **kwargs)
        value = metric(out)
        if not isinstance(value, Tensor) or value.numel() != 1 or not value.requires_grad:
            raise ValueError(
                "attribution_patch needs a metric that returns a scalar tensor computed from the "
                "output (differentiable); got "
                + (f"shape {tuple(value.shape)}" if isinstance(value, Tensor) else repr(value))
            )
        corrupted_value = float(value.detach())
        difference = check_metric_pair(clean_value, corrupted_value)  # as patch() does
        unseen = [p for p in prefixes if p not in clean_calls or p not in corrupted_calls]
        if exact and unseen:
            raise ValueError(
                f"qk_fix=True recomputes each attention call, and {unseen[0]} ran none this "
                "library could see (only attention that runs through multihead's attention "
                "function can be recomputed); pass qk_fix=False for the linear estimate"
            )
        passes: list[int | None] = [b for b in range(blocks)] if grad_drop else [None]
        total: dict[str, Tensor] = {}
        for i, block in enumerate(passes):
            dropped["block"] = block
            taps = list(zeros.values())
            got = torch.autograd.grad(
                value, taps, retain_graph=i + 1 < len(passes), allow_unused=True
            )
            grads = {
                n: torch.zeros_like(t) if g is None else g
                for n, g, t in zip(zeros, got, taps, strict=True)
            }
            with torch.no_grad():
                found = _estimates(
                    grads, values, clean_cache, rows, streams, blocks, point_rows, exact,
                    prefixes, patterns, clean_calls, corrupted_calls, heads, head_positions,
                )  # fmt: skip
            for kind, grid in found.items():
                grid = grid / difference
                grid = grid.abs() if grad_drop else grid
                total[kind] = grid if kind not in total else total[kind] + grid
    if grad_drop:
        total = {kind: grid / (blocks - 1) for kind, grid in total.items()}

    head_grid = total.get("heads")
    pos_grid = total.get("head_positions")
    resid_result = {s: total[s] for s in streams}
    kinds: tuple[str, ...] = ("q", "k", "q_positions", "k_positions")
    qk_result = {k: total[k] for k in kinds if k in total}
    if verify:

        def real(hooks: list) -> float:
            with torch.no_grad():
                out = run_with_hooks(model, *corrupted_in, fwd_hooks=hooks, **kwargs)
            return (_value(metric, out) - corrupted_value) / difference

        def head_hook(name: str, head: int, pos: int | None) -> list:
            value = clean_cache[name][:, :, [head]]
            return [(name, replace_heads([head], value, None if pos is None else [pos]))]

        z = [name for name, _ in rows]
        if head_grid is not None:
            head_grid = _verified(head_grid, verify, lambda i: real(head_hook(z[i[0]], i[1], None)))
        if pos_grid is not None:
            pos_grid = _verified(pos_grid, verify, lambda i: real(head_hook(z[i[0]], *i[1:])))
        for kind, grid in qk_result.items():
            at = [name for name, _ in point_rows[kind[0]]]
            qk_result[kind] = _verified(
                grid,
                verify,
                lambda i, at=at: real(head_hook(at[i[0]], i[1], i[2] if len(i) > 2 else None)),
            )
        for s, grid in resid_result.items():
            resid_result[s] = _verified(
                grid,
                verify,
                lambda lp, s=s: real(
                    [(act_name(s, lp[0]), _patch_positions(clean_cache[act_name(s, lp[0])], lp[1]))]
                ),
            )
    return PatchResult(
        clean_value,
        corrupted_value,
        head_grid if heads else None,
        pos_grid,
        resid_result,
        tuple(name for name, _ in rows),
        qk_result,
        _note(grad_drop, exact, bool(streams), verify),
    )


def _drop_points(model: nn.Module, known: set[str], blocks: int) -> list[tuple[str, int]]:
    """(hook name, block) of each block's residual contributions (hook_attn_out, hook_mlp_out),
    which GradDrop cuts from the gradient one block at a time."""
    if blocks < 2:
        raise ValueError(
            f"grad_drop needs a model of at least 2 blocks with blocks.{{i}}.hook_resid_pre "
            f"hook points; {type(model).__name__} has {blocks}"
        )
    found = [
        (f"blocks.{b}.{point}", b)
        for b in range(blocks)
        for point in ("hook_attn_out", "hook_mlp_out")
        if f"blocks.{b}.{point}" in known
    ]
    if {b for _, b in found} != set(range(blocks)):
        raise ValueError(
            f"grad_drop needs blocks.{{i}}.hook_attn_out (or hook_mlp_out) on every block of "
            f"{type(model).__name__}: the residual contributions it cuts"
        )
    return found


def _estimates(
    grads: dict[str, Tensor],
    values: dict[str, Tensor],
    clean_cache: Any,
    rows: list[tuple[str, int]],
    streams: list[str],
    blocks: int,
    point_rows: dict[str, list[tuple[str, int]]],
    exact: bool,
    prefixes: list[str],
    patterns: list[str],
    clean_calls: dict[str, Any],
    corrupted_calls: dict[str, Any],
    heads: bool,
    head_positions: bool,
) -> dict[str, Tensor]:
    """Every estimate from one backward's gradients (not yet divided by the metric's
    difference): kind -> grid, as PatchResult holds them."""

    def linear(name: str) -> Tensor:
        """(B, T, ...) -> (T, ...): (clean - corrupted) . gradient, summed over the batch."""
        delta = clean_cache[name] - values[name]
        return (delta * grads[name]).sum(-1).sum(0).double()

    found: dict[str, Tensor] = {}
    if rows:
        head_pos = torch.stack([linear(name).t() for name, _ in rows])  # (L, T, H) -> (L, H, T)
        if heads:
            found["heads"] = head_pos.sum(-1)
        if head_positions:
            found["head_positions"] = head_pos
    for point, prow in point_rows.items():
        if not exact:
            grid = torch.stack([linear(name).t() for name, _ in prow])  # (L, H or Hkv, T)
            found[point] = grid.sum(-1)
            if head_positions:
                found[f"{point}_positions"] = grid
            continue
        per_layer, whole = [], []
        for prefix, pattern in zip(prefixes, patterns, strict=True):
            call, clean = corrupted_calls[prefix], clean_calls[prefix]
            if point == "q":
                effect = query_effects(call, clean.q, grads[pattern]).sum(0)  # (H, T)
                per_layer.append(effect)
                whole.append(effect.sum(-1))  # each row depends on its own query only
            else:
                if head_positions:
                    per_layer.append(key_effects(call, clean.k, grads[pattern], True).sum(0))
                whole.append(key_effects(call, clean.k, grads[pattern], False).sum(0))
        found[point] = torch.stack(whole)
        if head_positions:
            found[f"{point}_positions"] = torch.stack(per_layer)
    for s in streams:
        found[s] = torch.stack([linear(act_name(s, i)) for i in range(blocks)])
    return {kind: grid.float() for kind, grid in found.items()}


def _note(grad_drop: bool, exact: bool, resid: bool, verify: int) -> str:
    """What the estimate's values are, for `PatchResult.table()`."""
    parts = [
        "estimates (attribution_patch): "
        + (
            "GradDrop magnitudes, mean |estimate| over the blocks' dropped backward passes "
            "(the sign is lost)"
            if grad_drop
            else "gradient estimates"
        )
    ]
    if exact:
        parts.append("q/k nodes with AtP*'s QK fix (attention recomputed)")
    if verify:
        parts.append(f"the top {verify} of each kind patched for real (signed)")
    if resid:
        parts.append(
            "resid: a poor screen (0 and 1 of the real top 10 on SmolLM2's IOI and fact "
            "prompts, AtP or AtP*)"
        )
    return "; ".join(parts)


def _verified(grid: Tensor, k: int, patched) -> Tensor:
    """`grid` with its k entries of largest |estimate| replaced by `patched(index)` (a real
    patch's fraction; index: the entry's tuple of grid indices)."""
    out = grid.clone()
    flat = grid.flatten().abs().argsort(descending=True)[:k]
    for i in flat.tolist():
        index = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), grid.shape))
        out[index] = patched(index)
    return out
