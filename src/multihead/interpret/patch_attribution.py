"""Attribution patching (Nanda 2023; Syed et al. 2023): every patch of `patch()` estimated at once,
from one forward and one backward of the corrupted input.

    approx = attribution_patch(model, clean_ids, corrupted_ids, metric, head_positions=True)
    approx.head_positions      # (L, H, T), like patch(...).head_positions

Patching an activation a from its corrupted value a' to its clean value a changes the metric by
about (a - a') . dmetric/da, the gradient taken at the corrupted run: exact when the metric is
linear in a (e.g. the last block's stream read by a linear metric through a model without a final
norm), an approximation elsewhere (compare with `patch()` on the top entries: the docs report the
correlation). The estimates are divided by metric(clean) - metric(corrupted), as `patch()`'s
fractions are. The gradient with respect to each hooked activation is the total one (through
every later layer): each hook adds a zero tensor that requires grad, and the gradient is taken
with respect to those.

Where the linear estimate fails, and what `verify` does. Measured against real `patch()` on
SmolLM2-135M-Instruct (the Q4_1 GGUF; `multihead bench patching --attribution`): on IOI (8
prompts "When A and B went to the store, B gave a drink to", metric logit(A) - logit(B)) the
per-head estimate tracks real patching (r = 0.98); on the factual-recall prompt "The Eiffel Tower
is in the city of" against "The Colosseum is in the city of" (metric: the logit of " Paris") it
does not (r = 0.68): early heads whose effect passes through later attention and MLPs get the
wrong size or sign. For the residual stream (replacing the whole stream at one position), 0
(IOI) and 1 (fact) of the real top 10 are in the estimate's top 10, so asking for `resid` warns.
`verify=k` patches the k entries the estimate ranks highest (by |estimate|, per kind) for real,
one forward each, and puts the real fractions in their place: per head, verify=10 gives
r = 0.993 (IOI) and 0.987 (fact) with 10 and 9 of the real top 10, at a cost of the clean and
corrupted forwards, one backward and k forwards per kind asked. AtP*'s QK fix and GradDrop
(Kramar et al. 2024) are not implemented: see docs/toolkit-cache.md.

Shapes: as `patch()`: heads (L, H), head_positions (L, H, T), resid[name] (L, T).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..hooked.ablation import replace_heads
from ..hooked.hooks import act_name, hook_names, run_with_cache, run_with_hooks, unwrap
from ..hooked.metric_checks import check_metric_pair
from ..hooked.patching import Metric, PatchResult, _as_inputs, _patch_positions, _value
from ..hooked.scope import attention_hook_names


def attribution_patch(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    *,
    heads: bool = True,
    head_positions: bool = False,
    resid: str | Sequence[str] = (),
    verify: int = 0,
    **kwargs: Any,
) -> PatchResult:
    """Estimate `patch(model, clean, corrupted, metric, ...)` linearly (see the module
    docstring): the same arguments and result type. `metric(output)` must return a scalar
    tensor that is differentiable in the output. `verify`: patch the `verify` entries of each
    kind with the largest |estimate| for real and report those real fractions (0: none).
    Asking for `resid` warns: the linear estimate of replacing the whole stream ranks poorly."""
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "attribution_patch needs gradients, and torch.inference_mode() is on: call it "
            "outside inference_mode (torch.no_grad() around it is fine; it enables grad itself)"
        )
    model = unwrap(model)
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise ValueError(f"verify must be a non-negative int, got {verify!r}")
    clean_in, corrupted_in = _as_inputs(clean), _as_inputs(corrupted)
    streams = [resid] if isinstance(resid, str) else list(resid)
    for name in streams:
        if name not in ("resid_pre", "resid_post"):
            raise ValueError(f"resid names 'resid_pre' and/or 'resid_post', got {name!r}")
    if streams:
        warnings.warn(
            "attribution_patch on the residual stream is a poor screen: a linear estimate of "
            "replacing the whole stream at one position found 0 and 1 of the real top 10 on "
            "SmolLM2's IOI and factual-recall prompts (see the docs); confirm with "
            "patch(..., resid=...) or pass verify=k to patch the k largest estimates for real",
            UserWarning,
            stacklevel=2,
        )
    rows = attention_hook_names(model, "hook_z") if heads or head_positions else []
    known = set(hook_names(model))
    blocks = 0
    while act_name("resid_pre", blocks) in known:
        blocks += 1
    names = [name for name, _ in rows] + [act_name(s, i) for s in streams for i in range(blocks)]

    with torch.no_grad():
        clean_out, clean_cache = run_with_cache(model, *clean_in, names=names, **kwargs)
        clean_value = _value(metric, clean_out)
    # The corrupted run, with a zero that requires grad added at every point: its gradient is
    # the metric's total derivative with respect to the activation there.
    zeros: dict[str, Tensor] = {}
    values: dict[str, Tensor] = {}

    def tap(activation: Tensor, name: str) -> Tensor:
        zero = torch.zeros_like(activation, requires_grad=True)
        zeros[name], values[name] = zero, activation.detach()
        return activation + zero

    with torch.enable_grad():
        out = run_with_hooks(model, *corrupted_in, fwd_hooks=[(n, tap) for n in names], **kwargs)
        value = metric(out)
        if not isinstance(value, Tensor) or value.numel() != 1 or not value.requires_grad:
            raise ValueError(
                "attribution_patch needs a metric that returns a scalar tensor computed from the "
                "output (differentiable); got "
                + (f"shape {tuple(value.shape)}" if isinstance(value, Tensor) else repr(value))
            )
        corrupted_value = float(value.detach())
        difference = check_metric_pair(clean_value, corrupted_value)  # as patch() does
        grads = dict(
            zip(zeros, torch.autograd.grad(value.sum(), list(zeros.values())), strict=True)
        )

    def effect(name: str) -> Tensor:
        """(B, T, ...) -> (T, ...): (clean - corrupted) . gradient, summed over the batch."""
        delta = clean_cache[name] - values[name]
        return (delta * grads[name]).sum(-1).sum(0).float() / difference

    head_pos: Tensor | None = None
    if rows:
        per_layer = [effect(name).t() for name, _ in rows]  # (T, H) -> (H, T)
        head_pos = torch.stack(per_layer)  # (L, H, T)
    resid_result = {
        s: torch.stack([effect(act_name(s, i)) for i in range(blocks)]) for s in streams
    }
    head_grid = head_pos.sum(-1) if heads and head_pos is not None else None
    pos_grid = head_pos if head_positions else None
    if verify:

        def real(hooks: list) -> float:
            with torch.no_grad():
                out = run_with_hooks(model, *corrupted_in, fwd_hooks=hooks, **kwargs)
            return (_value(metric, out) - corrupted_value) / difference

        def z_hook(layer: int, head: int, pos: int | None) -> list:
            name = rows[layer][0]
            value = clean_cache[name][:, :, [head]]
            return [(name, replace_heads([head], value, None if pos is None else [pos]))]

        if head_grid is not None:
            head_grid = _verified(head_grid, verify, lambda lh: real(z_hook(lh[0], lh[1], None)))
        if pos_grid is not None:
            pos_grid = _verified(pos_grid, verify, lambda p: real(z_hook(p[0], p[1], p[2])))
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
        head_grid,
        pos_grid,
        resid_result,
        tuple(name for name, _ in rows),
    )


def _verified(grid: Tensor, k: int, patched) -> Tensor:
    """`grid` with its k entries of largest |estimate| replaced by `patched(index)` (a real
    patch's fraction; index: the entry's tuple of grid indices)."""
    out = grid.clone()
    flat = grid.flatten().abs().argsort(descending=True)[:k]
    for i in flat.tolist():
        index = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), grid.shape))
        out[index] = patched(index)
    return out
