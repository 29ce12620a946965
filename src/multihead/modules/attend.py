"""Running one attention call under hooks, and the per-head output: shared by
`MultiHeadAttention` and the torch drop-in.

Asking costs only what is asked. With no hooks the call goes straight to `dispatch` (the fused
kernel). Hooks that only read `hook_attn_scores` / `hook_pattern` (caches, `capture`) leave the
model's computation on its fused path and compute the weights beside it with the eager backend;
hooks that may replace them route this layer's call through the eager backend, which applies
the replacement.

Shapes: call q (B, H, Tq, D); out (B, H, Tq, Dv); weights (B, H, Tq, Tk); z (B, Tq, H, Dv) as
hooks see it; result (B, Tq, H, C).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional.attention import dispatch
from ..functional.backends.eager import eager_attention
from ..functional.call import AttentionCall
from ..hook_points import ModuleHooks

WEIGHT_POINTS = ("hook_attn_scores", "hook_pattern")
ATTENTION_HOOK_POINTS = (
    "hook_q",
    "hook_k",
    "hook_v",
    "hook_attn_scores",
    "hook_pattern",
    "hook_z",
    "hook_result",
)
# q and k after rotation, where a position scheme rotates them (RoPE)
ROTARY_HOOK_POINTS = (
    *ATTENTION_HOOK_POINTS[:3],
    "hook_rot_q",
    "hook_rot_k",
    *ATTENTION_HOOK_POINTS[3:],
)


def attend(call: AttentionCall, hooks: ModuleHooks | None) -> tuple[Tensor, Tensor | None]:
    """`dispatch(call)`, with the attention-weight hook points and call observers served."""
    if hooks is None or not (hooks.observers or any(p in hooks for p in WEIGHT_POINTS)):
        return dispatch(call)
    seen: list[Tensor] = []

    def on_scores(scores: Tensor) -> Tensor:
        return hooks("hook_attn_scores", scores)

    def on_pattern(pattern: Tensor) -> Tensor:
        pattern = hooks("hook_pattern", pattern)
        seen.append(pattern)
        return pattern

    scores_hook = on_scores if "hook_attn_scores" in hooks else None
    if call.return_weights or any(p in hooks.writers for p in WEIGHT_POINTS):
        # The weights are computed anyway, or a hook may replace them: run this call eagerly.
        out, weights = eager_attention(call, on_scores=scores_hook, on_pattern=on_pattern)
    else:
        # Readers only: the model's own computation stays on its fused path, untouched; the
        # weights are computed beside it (before dropout, as the pattern is defined).
        out, weights = dispatch(call)
        side = call._replace(dropout_p=0.0, return_weights=False)
        with torch.no_grad():
            eager_attention(side, on_scores=scores_hook, on_pattern=on_pattern)
    if hooks.observers:
        hooks.observe(call, seen[-1].detach())
    return out, weights


def head_results(
    z: Tensor, weight: Tensor, bias: Tensor | None, hooks: ModuleHooks
) -> Tensor | None:
    """`hook_result`: each head's contribution to the output, (B, Tq, H, C). z (B, H, Tq, Dv);
    weight (C, H * Dv). When a hook may replace it, returns the output made from it, the sum
    over heads plus the output bias (B, Tq, C); for readers, None (the caller projects as usual,
    so reading changes nothing)."""
    C = weight.shape[0]
    H, Dv = z.shape[1], z.shape[3]
    per_head = weight.view(C, H, Dv)  # (C, H * Dv) -> (C, H, Dv)
    result = hooks("hook_result", torch.einsum("bhtd,chd->bthc", z, per_head))  # (B, Tq, H, C)
    if "hook_result" not in hooks.writers:
        return None
    out = result.sum(dim=2)
    return out if bias is None else out + bias
