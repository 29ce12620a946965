"""The plain path of `MultiHeadAttention.forward` (its `_plain_forward`): the common call in the
fewest Python steps. Shapes: query (B, T, C) -> (B, T, C); q (B, H, T, D), k, v (B, Hkv, T, D).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..functional.attention import dispatch_plain
from .cache import KVCache
from .projections import linear, split_fused, submodule


def plain_forward(module: Any, query: Tensor, causal: bool, cache: KVCache | None) -> Tensor:
    """The common call, with nothing of the general path's to decide: batched
    self-attention through the packed projection; no hooks, mask, positions, position
    scheme or structure of the call's own; no cache or a KVCache. The same four steps as
    `forward` in the fewest Python calls: at small shapes each costs ~1% of the call
    (`multihead bench attention`, small calls vs the hand-written floor: a decode step at
    width 576 1.22x -> 1.20x, an eval call at width 256 1.17x -> 1.15x; then, with the
    fast path tested first in `forward`, a static cache written by `append_plain` and
    fewer calls in make_call / dispatch / sdpa: decode 1.19x -> 1.15x, eval 1.13x ->
    1.12x, medians of 31 rounds in three alternating process pairs; then `dispatch_plain`,
    which builds no AttentionCall where auto would run torch's kernel as is: decode
    1.16x -> 1.13x, eval 1.14x -> 1.10x, medians of per-round ratios).
    query (B, T, C) -> (B, T, C)."""
    H, Hkv = module.num_heads, module.num_kv_heads
    B, T, _ = query.shape
    # (B, T, C) -> q (B, H, T, D), k, v (B, Hkv, T, D)
    q, k, v = split_fused(linear(submodule(module, "in_proj"), query), (H, Hkv, Hkv))
    mask, window = None, None
    dropout_p = module.dropout if module.training else 0.0
    if cache is None:
        out = dispatch_plain(q, k, v, causal, dropout_p, mask, window)
    else:
        point = cache.checkpoint()  # (a backend that refuses at run time: undo the append)
        try:
            k, v, mask, window = cache.append_plain(module, k, v)
            if mask is not None:  # padding the cache remembers: (B, Tk) -> (B, 1, 1, Tk)
                mask = mask[:, None, None, :]
            out = dispatch_plain(q, k, v, causal, dropout_p, mask, window)
        except (ValueError, TypeError):
            cache.rollback(point)
            raise
    # (B, H, T, Dv) -> (B, T, H * Dv): free when the kernel wrote (B, T, H, Dv), as SDPA does
    merged = out.transpose(1, 2).reshape(B, T, H * out.shape[3])
    return linear(submodule(module, "out_proj"), merged)
