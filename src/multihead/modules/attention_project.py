"""Steps 1 and 4 of `MultiHeadAttention.forward`: the input projections (inputs -> q, k, v split
into heads) and the merge of heads through the output projection. Functions of the module (its
methods `_project`, `_project_query`, `_project_key_value`, `_output` are these).

Shapes: query (B, Tq, C), key (B, Tk, kdim), value (B, Tk, vdim); q (B, H, Tq, D), k and v
(B, Hkv, Tk, D); out (B, H, Tq, Dv) -> (B, Tq, C).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import Tensor

from ..hook_points import ModuleHooks
from .attend import head_results
from .blocked_projection import blocked_projection, blocked_projection_serves
from .projections import (
    PackedWeights,
    heads_first,
    linear,
    packed_key_value,
    packed_query,
    packed_rows,
    project_packed,
    split_fused,
    submodule,
)


def packed_weights(module: Any) -> PackedWeights:
    """The packed (q | k | v) projection's weight, bias and how to run it."""
    return PackedWeights(
        module.in_proj.weight, module.in_proj.bias, partial(linear, module.in_proj)
    )


def project(
    module: Any, query: Tensor, key: Tensor, value: Tensor, self_attention: bool, blocked=False
):
    """Inputs -> q (B, H, Tq, D), k and v (B, Hkv, Tk, D). `blocked`: self-attention's
    q, k, v as whole blocks of one buffer (`blocked_projection`), not column ranges."""
    H, Hkv = module.num_heads, module.num_kv_heads
    if blocked:
        packed = packed_weights(module)
        q_rows, kv_rows = packed_rows(packed, (H, Hkv))
        parts = blocked_projection(query, packed.weight, packed.bias, (q_rows, kv_rows, kv_rows))
        q, k, v = (heads_first(p, n) for p, n in zip(parts, (H, Hkv, Hkv), strict=True))
        return q, k, v
    if not module.packed:
        q, k, v = (
            linear(module.q_proj, query),
            linear(module.k_proj, key),
            linear(module.v_proj, value),
        )
        return heads_first(q, H), heads_first(k, Hkv), heads_first(v, Hkv)
    if self_attention:  # the hot path: one fused matmul, viewed per head, then split
        q, k, v = split_fused(linear(submodule(module, "in_proj"), query), (H, Hkv, Hkv))
        return q, k, v
    return project_packed(packed_weights(module), (H, Hkv), query, key, value, False)


def project_query(module: Any, query: Tensor) -> Tensor:
    """query (B, Tq, C) -> q (B, H, Tq, D), without touching the key/value rows."""
    H = module.num_heads
    if module.packed:
        return heads_first(packed_query(packed_weights(module), (H, module.num_kv_heads), query), H)
    return heads_first(linear(module.q_proj, query), H)


def project_key_value(module: Any, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """key (B, Tk, kdim), value (B, Tk, vdim) -> k, v (B, Hkv, Tk, D)."""
    Hkv = module.num_kv_heads
    if module.packed:
        return packed_key_value(packed_weights(module), (module.num_heads, Hkv), key, value)
    return heads_first(linear(module.k_proj, key), Hkv), heads_first(
        linear(module.v_proj, value), Hkv
    )


def output(module: Any, out: Tensor, hooks: ModuleHooks | None) -> Tensor:
    """out (B, H, Tq, Dv) -> (B, Tq, C)."""
    if hooks is not None:
        out = hooks.heads("hook_z", out)
        if "hook_result" in hooks:
            projected = head_results(out, module.out_proj.weight, module.out_proj.bias, hooks)
            if projected is not None:
                return projected
    B, H, Tq, Dv = out.shape
    # (B, H, Tq, Dv) -> (B, Tq, H * Dv): free when the kernel wrote (B, Tq, H, Dv), as SDPA does
    out_proj = submodule(module, "out_proj")
    return linear(out_proj, out.transpose(1, 2).reshape(B, Tq, H * Dv))


def blocked_output(module: Any, out: Tensor) -> Tensor:
    """`output` without hooks for a call whose q, k, v came as blocks (`blocked_projection`):
    the output projection as a blocked projection of one block where it serves (a plain
    nn.Linear, CPU, ...), so that beside a busy process it too runs as units of rows on the
    tiled backend's workers (`blocked_projection._way`), and the whole structured call has
    no parallel region of torch's threads; on free cores one product, as F.linear's.

    Why: between the workers' units (the attention, the q, k, v projection) a parallel region
    of torch's threads ends with libgomp's threads spinning on the cores the workers need.
    Measured, the module's documents_mod call at T 1024 beside a busy process, forward +
    backward, 48 interleaved rounds: 0.895x the time with F.linear (median 131 vs 151 ms).
    out (B, H, Tq, Dv) -> (B, Tq, C)."""
    B, H, Tq, Dv = out.shape
    merged = out.transpose(1, 2).reshape(B, Tq, H * Dv)
    out_proj = submodule(module, "out_proj")
    if blocked_projection_serves(out_proj, merged):
        params = out_proj._parameters  # (a plain nn.Linear: `_plain`)
        weight, bias = params["weight"], params["bias"]
        assert weight is not None
        return blocked_projection(merged, weight, bias, (weight.shape[0],))[0]
    return linear(out_proj, merged)
