"""How torch.nn.MultiheadAttention (torch 2.13) reads `attn_mask`, `key_padding_mask` and
`is_causal`, and the same masks in multihead's convention.

torch takes one of two paths, and they disagree about `is_causal`:
- the fused fast path (eval, no grad, batch-first self-attention, ... see `torch_fast_path`)
  applies `attn_mask` (merged with `key_padding_mask`) and ignores `is_causal`, even without a
  mask;
- the standard path requires `attn_mask` with `is_causal`, and when there is no key padding mask
  and no weights are asked for, trusts the hint: it runs SDPA's top-left causal mask and ignores
  `attn_mask`. Otherwise it applies `attn_mask`.
The drop-in follows whichever path torch would take, deciding from flags, dtypes and devices only
(never tensor values), so the decision is traceable.

Shapes: B batch, H heads, L queries, S keys (with any appended bias_k / zero keys).
Masks come out broadcastable to (B, H, L, S): `mask` True = may attend, `bias` added.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# torch's own helpers for its gate, so that the drop-in decides exactly as torch does.
from torch.nn.modules.activation import (
    _arg_requires_grad,
    _check_arg_device,
    _is_make_fx_tracing,
)

from ..functional import masks


def torch_fast_path(
    module: nn.MultiheadAttention,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
) -> bool:
    """Whether torch.nn.MultiheadAttention.forward would run its fused kernel on these inputs."""
    if any(m is not None and m.is_floating_point() for m in (attn_mask, key_padding_mask)):
        return False
    if not torch.backends.mha.get_fastpath_enabled():
        return False
    if query.dim() != 3 or query is not key or key is not value:
        return False
    weight, bias = module.in_proj_weight, module.in_proj_bias
    if weight is None or bias is None:  # without an input bias torch takes the standard path
        return False
    if query.dtype != bias.dtype or query.dtype != weight.dtype:
        return False
    if module.training or module.num_heads % 2 or not module.batch_first:
        return False
    if module.bias_k is not None or module.bias_v is not None or module.add_zero_attn:
        return False
    if not module._qkv_same_embed_dim or query.is_nested or torch.is_autocast_enabled():
        return False
    args = (query, weight, bias, module.out_proj.weight, module.out_proj.bias)
    if torch.overrides.has_torch_function(args):
        return False
    if not all(_check_arg_device(x) for x in args):
        return False
    if torch.is_grad_enabled() and any(_arg_requires_grad(x) for x in args):
        return False
    return not _is_make_fx_tracing()


def uses_causal_hint(
    is_causal: bool, fast_path: bool, key_padding_mask: Tensor | None, need_weights: bool
) -> bool:
    """torch runs SDPA's top-left causal mask instead of `attn_mask`."""
    return bool(is_causal) and not fast_path and key_padding_mask is None and not need_weights


def multihead_masks(
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    causal_hint: bool,
    num_heads: int,
    L: int,
    S: int,
    extra: int,
    device: torch.device,
) -> tuple[Tensor | None, Tensor | None, bool]:
    """torch's masks (True = blocked, or additive) -> (mask True = may attend, bias, causal),
    broadcastable to (B, H, L, S), padded for the `extra` appended keys (bias_k, zero key)."""
    if causal_hint:
        if L == S:
            return None, None, True  # top-left and bottom-right coincide: the fused kernel's own
        return masks.causal(L, S, align="top_left", device=device), None, False
    mask: Tensor | None = None
    bias: Tensor | None = None
    if attn_mask is not None:
        if attn_mask.dim() == 3:  # (B * H, L, S0) -> (B, H, L, S0); unbatched (H, L, S0) too
            attn_mask = attn_mask.view(-1, num_heads, *attn_mask.shape[-2:])
        mask, bias = _split(attn_mask, extra)
    if key_padding_mask is not None:
        kp_mask, kp_bias = _split(key_padding_mask[:, None, None, :], extra)  # (B, 1, 1, S)
        mask = masks.combine(mask, kp_mask)
        bias = kp_bias if bias is None else bias if kp_bias is None else bias + kp_bias
    return mask, bias, False


def _split(torch_mask: Tensor, extra: int) -> tuple[Tensor | None, Tensor | None]:
    """One torch mask -> (boolean may-attend mask, None) or (None, additive bias), with `extra`
    appended keys that every query may attend to."""
    if torch_mask.dtype == torch.bool:
        allowed = ~torch_mask
        if extra:
            allowed = F.pad(allowed, (0, extra), value=True)
        return allowed, None
    bias = F.pad(torch_mask, (0, extra), value=0.0) if extra else torch_mask
    return None, bias
