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

Shapes: as `patch()`: heads (L, H), head_positions (L, H, T), resid[name] (L, T).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..hooked.hooks import act_name, hook_names, run_with_cache, run_with_hooks, unwrap
from ..hooked.metric_checks import check_metric_pair
from ..hooked.patching import Metric, PatchResult, _as_inputs, _value
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
    **kwargs: Any,
) -> PatchResult:
    """Estimate `patch(model, clean, corrupted, metric, ...)` linearly (see the module
    docstring): the same arguments and result type. `metric(output)` must return a scalar
    tensor that is differentiable in the output."""
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "attribution_patch needs gradients, and torch.inference_mode() is on: call it "
            "outside inference_mode (torch.no_grad() around it is fine; it enables grad itself)"
        )
    model = unwrap(model)
    clean_in, corrupted_in = _as_inputs(clean), _as_inputs(corrupted)
    streams = [resid] if isinstance(resid, str) else list(resid)
    for name in streams:
        if name not in ("resid_pre", "resid_post"):
            raise ValueError(f"resid names 'resid_pre' and/or 'resid_post', got {name!r}")
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
    return PatchResult(
        clean_value,
        corrupted_value,
        head_pos.sum(-1) if heads and head_pos is not None else None,
        head_pos if head_positions else None,
        resid_result,
        tuple(name for name, _ in rows),
    )
