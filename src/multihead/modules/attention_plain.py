"""The plain path of `MultiHeadAttention.forward` (its `_plain_forward`): the common call in the
fewest Python steps. Shapes: query (B, T, C) -> (B, T, C); q (B, H, T, D), k, v (B, Hkv, T, D).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..functional.attention import dispatch_plain
from ..functional.backends import SDPA_BACKEND
from ..functional.backends.registry import _PLAIN_ORDER as _plain_order
from ..positional.rope import RotaryEmbedding
from ..positional.scheme import PositionScheme
from .attention_inputs import check_positions
from .cache import KeySet, KVCache
from .projections import linear
from .quantized.kernels import (
    append_attend,
    attend_one,
    attend_prefix,
    kernels_available,
    rope_rows_,
)
from .static_cache import StaticKVCache


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
        if B == 1 and T == 1 and dropout_p == 0.0:  # a decoding step's row: one C call
            merged = _append_attend_row(module, heads, H, Hkv, cache)  # (1, 1, H * D)
            if merged is not None:
                return _project_out(out_proj, merged, direct)
        # (B, H + 2 Hkv, T, D) -> q (B, H, T, D), kv (B, 2 Hkv, T, D): the cache takes k and v
        # together (a static one in one copy)
        q, kv = heads.split_with_sizes((H, 2 * Hkv), dim=1)
        point = cache.checkpoint()  # (a backend that refuses at run time: undo the append)
        try:
            k, v, mask, window = cache.append_plain(module, kv)
            if mask is None and window is None and B == 1 and T == 1 and dropout_p == 0.0:
                merged = _attend_one_row(q, k, v)  # (1, 1, H * D) or None
                if merged is not None:
                    return _project_out(out_proj, merged, direct)
            if mask is not None:  # padding the cache remembers: (B, Tk) -> (B, 1, 1, Tk)
                mask = mask[:, None, None, :]
            out = dispatch_plain(q, k, v, causal, dropout_p, mask, window)
        except (ValueError, TypeError):
            cache.rollback(point)
            raise
    # (B, H, T, Dv) -> (B, T, H * Dv): free when the kernel wrote (B, T, H, Dv), as SDPA does
    merged = out.transpose(1, 2).reshape(B, T, H * out.shape[3])
    return _project_out(out_proj, merged, direct)


def _project_out(out_proj: Any, merged: Tensor, direct: bool) -> Tensor:
    if direct:
        params = out_proj._parameters
        return F.linear(merged, params["weight"], params["bias"])
    return linear(out_proj, merged)


def _append_attend_row(
    module: Any, heads: Tensor, H: int, Hkv: int, cache: KVCache
) -> Tensor | None:
    """A decoding step's append and attention (one token, one row: heads (1, H + 2 Hkv, 1, D)
    rotated) as one C call (`kernels.append_attend`): the keys and values written into the
    cache's buffer at its next slot (`KVCache.plain_row_slot`, which moves the counts on as
    `append_plain` does), then `_attend_one_row`'s attention over every cached key: its
    values bit for bit. None, the cache untouched, where the two steps must run apart."""
    D = heads.shape[3]
    if (
        heads.dtype is not torch.float32
        or not heads.is_cpu
        or (heads.requires_grad and torch.is_grad_enabled())
        or D == 0
        or not heads.is_contiguous()
        or not (_plain_order and _plain_order[0] is SDPA_BACKEND)
        or torch.compiler.is_compiling()
        or not kernels_available()
    ):
        return None
    slot = cache.plain_row_slot(module, Hkv, D)
    if slot is None:
        return None
    return append_attend(heads, slot[0], slot[1], H)


def _attend_one_row(q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
    """A decoding step's attention (one token, one row: q (1, H, 1, D), every cached key
    seen) as one C call (`kernels.attend_one`) where `dispatch_plain` would run SDPA's kernel
    (the sdpa backend first in the registry's order): float32 on the CPU, no gradient, keys
    and values with contiguous rows of D. Returns (1, 1, H * D), SDPA's values within float32
    rounding; None elsewhere (the caller dispatches)."""
    D = q.shape[3]
    if (
        q.dtype is not torch.float32
        or k.dtype is not torch.float32
        or v.dtype is not torch.float32
        or not q.is_cpu
        or not k.is_cpu
        or not v.is_cpu
        or not (_plain_order and _plain_order[0] is SDPA_BACKEND)
        or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        or D == 0
        or k.shape[2] == 0
        or v.shape[3] != D
        or q.shape[1] % k.shape[1] != 0
        or not q.is_contiguous()
        or k.stride(3) != 1
        or k.stride(2) != D
        or v.stride(3) != 1
        or v.stride(2) != D
    ):
        return None
    return attend_one(q, k, v)


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
    elif B == 1 and T == 1 and _rotates_one_row(position, heads, count, positions):
        return heads
    position.rotate_heads_(heads, count, positions)
    return heads


def _rotates_one_row(
    position: PositionScheme, heads: Tensor, count: int, positions: Tensor
) -> bool:
    """A decoding step's RoPE (one token, one row: heads (1, n, 1, D), float32 on the CPU, no
    gradient) as one C call over the `count` contiguous heads (`kernels.rope_rows_`), the
    values of `RotaryEmbedding.rotate_heads_` bit for bit; False (nothing done) elsewhere: a
    scheme that rotates otherwise, a partial rotary dimension, no compiled kernels."""
    if (
        type(position).rotate_heads_ is not RotaryEmbedding.rotate_heads_
        or heads.dtype is not torch.float32
        or not heads.is_cpu
    ):
        return False
    rope: RotaryEmbedding = position  # type: ignore[assignment]
    if rope.rotary_dim != rope.head_dim:
        return False
    cos, signed = rope._head_tables(heads, positions)
    x = heads[:, :count]  # (1, count, 1, D): contiguous
    D = heads.shape[-1]
    if (
        cos.numel() != D
        or signed.numel() != D
        or cos.dtype is not torch.float32
        or signed.dtype is not torch.float32
        or not (x.is_contiguous() and cos.is_contiguous() and signed.is_contiguous())
    ):
        return False
    return rope_rows_(x, cos, signed)


def static_row_attention(q: Tensor, keys: KeySet, cache: StaticKVCache) -> Tensor | None:
    """A decoding step's attention over a `StaticKVCache` (what the compiled decode step runs:
    one token, one row, q (1, H, 1, D); the keys its `keys_for` handed out, this step's
    written) as one operator (`kernels.attend_prefix`): one C call when the cache's key mask
    marks exactly its first `index` slots (no padding: checked at run time, inside the
    operator), else SDPA under that mask. Returns (1, H, 1, D), within float32 rounding of the
    dispatched SDPA; None where the general path must run: a ring or window cache, no key mask,
    another dtype or device, a gradient, another backend first in the registry. The caller
    checks that no user mask, structure, bias, hook, dropout or variant is involved."""
    k, v = keys.k, keys.v
    B, H, T, D = q.shape
    grad = torch.is_grad_enabled()
    if (
        B != 1
        or T != 1
        or cache.ring
        or cache.window is not None
        or keys.key_mask is None
        or q.dtype is not torch.float32
        or k.dtype is not torch.float32
        or v.dtype is not torch.float32
        or not (q.is_cpu and k.is_cpu and v.is_cpu)
        or not (_plain_order and _plain_order[0] is SDPA_BACKEND)
        or (grad and (q.requires_grad or k.requires_grad or v.requires_grad))
        or D == 0
        or v.shape[3] != D
        or H % k.shape[1] != 0
        or k.stride(3) != 1
        or k.stride(2) != D
        or v.stride(3) != 1
        or v.stride(2) != D
    ):
        return None
    return attend_prefix(q, k, v, keys.key_mask, cache.index)
