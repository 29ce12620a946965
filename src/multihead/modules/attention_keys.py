"""Step 2 of `MultiHeadAttention.forward`: the queries, and the keys they attend to (a KeySet):
this call's own, a KVCache's (positions continue from it), or a CrossKVCache's memory; RoPE
rotates q and k on the way (the module's `_queries_and_keys` is this function).

Shapes: q (B, H, Tq, D); the KeySet's k, v (B, Hkv, Tk, D).
"""

from __future__ import annotations

from typing import Any, cast

from torch import Tensor

from ..hook_points import ModuleHooks
from .attention_inputs import Inputs, check_key_mask
from .attention_positions import rotate_by_position
from .attention_project import project, project_key_value, project_query
from .cache import CrossKVCache, KeySet, KVCache


def queries_and_keys(
    module: Any,
    x: Inputs,
    cache: KVCache | CrossKVCache | None,
    causal: bool,
    positions: Tensor | None,
    hooks: ModuleHooks | None,
    blocked: bool = False,
) -> tuple[Tensor, KeySet]:
    if cache is not None and cache.cross:
        if positions is not None:
            raise ValueError("positions apply to self-attention; this call uses a cross cache")
        q = project_query(module, x.query)
        key, value = x.key, x.value

        def project_memory() -> tuple[Tensor, Tensor]:
            assert key is not None and value is not None
            return project_key_value(module, key, value)

        memory = cast(CrossKVCache, cache).memory_for(module, key, x.key_mask, project_memory)
        keys = memory._replace(causal=causal)
        if hooks is not None:
            q = hooks.heads("hook_q", q)
            keys = keys._replace(k=hooks.heads("hook_k", keys.k), v=hooks.heads("hook_v", keys.v))
        return q, keys
    source = x.query if x.self_attention else x.key
    assert source is not None
    key_mask = x.key_mask
    if key_mask is not None:
        key_mask = check_key_mask(key_mask, x.query.shape[0], source.shape[1], x.query.device)
    value = x.query if x.self_attention else x.value
    assert value is not None
    q, k, v = project(module, x.query, source, value, x.self_attention, blocked)
    if hooks is not None:
        q, k, v = hooks.heads("hook_q", q), hooks.heads("hook_k", k), hooks.heads("hook_v", v)
    if module.q_norm is not None:  # (after hook_q: it shows the projection, as W_Q reads)
        q = module.q_norm(q)
    if module.k_norm is not None:
        k = module.k_norm(k)
    # (a cross cache was served above)
    self_cache: KVCache | None = cache  # type: ignore[assignment]
    if module.position is not None or positions is not None:
        q, k = rotate_by_position(module.position, q, k, x, self_cache, positions, hooks)
    if self_cache is not None:
        if not x.self_attention:
            raise ValueError(
                "a KVCache serves self-attention; cross-attention takes a CrossKVCache"
            )
        return q, self_cache.keys_for(module, k, v, key_mask, causal)
    return q, KeySet(k, v, key_mask, None, causal, k.shape[2] - q.shape[2])
