"""The plain path of `MultiHeadAttention.forward` (its `_plain_forward`): the common call in the
fewest Python steps. Shapes: query (B, T, C) -> (B, T, C); q (B, H, T, D), k, v (B, Hkv, T, D).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..functional.attention import dispatch_plain
from ..positional.scheme import PositionScheme
from .attention_inputs import check_positions
from .cache import KVCache
from .projections import linear


def plain_forward(
    module: Any,
    query: Tensor,
    causal: bool,
    cache: KVCache | None,
    direct: bool = False,
    positions: Tensor | None = None,
) -> Tensor:
    """The common call, with nothing of the general path's to decide: batched
    self-attention through the packed projection; no hooks, mask, positions, position
    scheme or structure of the call's own; no cache or a KVCache. The same four steps as
    `forward` in the fewest Python calls and tensor ops: at small shapes each costs ~1% of
    the call, and more when the machine is shared (the weights of a layer leave the cache
    while Python runs): see `multihead bench attention`'s small calls against the
    hand-written floor, and docs/structured-attention.md. `direct`: both projections are
    plain nn.Linear layers (`projections._plain`, tested by the caller), run as F.linear on
    their parameters; otherwise each goes through `projections.linear`. A rotating position
    scheme (RoPE: `module._rotates`) turns the query and key heads of the fused projection
    in one pass, in place (`rotate_heads_`), by `positions` (checked here) or those after the
    cache's tokens.
    query (B, T, C) -> (B, T, C)."""
    H, Hkv = module.num_heads, module.num_kv_heads
    B, T, _ = query.shape
    layers = module._modules
    in_proj, out_proj = layers["in_proj"], layers["out_proj"]
    if direct:
        params = in_proj._parameters
        fused = F.linear(query, params["weight"], params["bias"])
    else:
        fused = linear(in_proj, query)
    # (B, T, (H + 2 Hkv) D) -> (B, H + 2 Hkv, T, D) -> q (B, H, T, D), k, v (B, Hkv, T, D):
    # viewed per head before the split (views of a split's pieces cost more)
    heads = fused.view(B, T, H + 2 * Hkv, module.head_dim).transpose(1, 2)
    if module._rotates:
        heads = _rotated_heads(module, heads, H + Hkv, positions, cache)
    dropout_p = module.dropout if module.training else 0.0
    if cache is None:
        q, k, v = heads.split_with_sizes((H, Hkv, Hkv), dim=1)
        out = dispatch_plain(q, k, v, causal, dropout_p)
    else:
        # (B, H + 2 Hkv, T, D) -> q (B, H, T, D), kv (B, 2 Hkv, T, D): the cache takes k and v
        # together (a static one in one copy)
        q, kv = heads.split_with_sizes((H, 2 * Hkv), dim=1)
        point = cache.checkpoint()  # (a backend that refuses at run time: undo the append)
        try:
            k, v, mask, window = cache.append_plain(module, kv)
            if mask is not None:  # padding the cache remembers: (B, Tk) -> (B, 1, 1, Tk)
                mask = mask[:, None, None, :]
            out = dispatch_plain(q, k, v, causal, dropout_p, mask, window)
        except (ValueError, TypeError):
            cache.rollback(point)
            raise
    # (B, H, T, Dv) -> (B, T, H * Dv): free when the kernel wrote (B, T, H, Dv), as SDPA does
    merged = out.transpose(1, 2).reshape(B, T, H * out.shape[3])
    if direct:
        params = out_proj._parameters
        return F.linear(merged, params["weight"], params["bias"])
    return linear(out_proj, merged)


def _rotated_heads(
    module: Any, heads: Tensor, count: int, positions: Tensor | None, cache: KVCache | None
) -> Tensor:
    """heads (B, H + 2 Hkv, T, D) with the first `count` (queries, keys) rotated by the
    module's position scheme: in place where no gradient is needed, else into a new tensor."""
    position: PositionScheme = module._modules["position"]
    B, _, T, _ = heads.shape
    if positions is None:  # after the cached tokens, or from 0
        positions = (
            torch.arange(T, device=heads.device)
            if cache is None
            else cache.next_positions(T, heads.device)
        )
    else:
        # (values read once per forward: a table made for this tensor means an earlier
        # layer checked it)
        values = not position.has_tables(positions, heads.dtype)
        positions = check_positions(positions, B, T, heads.device, values=values)
    if heads.requires_grad:  # (out of place: autograd keeps the projection's output)
        heads = heads.clone()
    position.rotate_heads_(heads, count, positions)
    return heads
