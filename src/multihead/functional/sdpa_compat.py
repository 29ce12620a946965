"""`scaled_dot_product_attention`: torch's signature and semantics, on multihead's one call path.

It takes what `torch.nn.functional.scaled_dot_product_attention` (torch 2.13) takes and returns the
same: leading dimensions that broadcast between query, key and value (any number of them);
`enable_gqa` with key and value head counts that each divide the query heads, and masks shaped
for the query heads; boolean masks (True = may attend) and float masks (float32 or the query's
dtype) broadcastable to the score shape; `is_causal` aligned top-left; `attn_mask` given as
`torch.nn.attention.bias.CausalBias`; zero and negative `scale`; `dropout_p` in [0, 1].

Deliberate differences (see README): a query row with no allowed key gives zeros on every device
and kernel (torch 2.13 on CPU does too; some torch kernels give NaN); `scale` must be a finite
Python number; bad input raises ValueError/TypeError naming the argument (torch: RuntimeError).

Shapes: query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.attention.bias import CausalBias, CausalVariant

from ..hook_points import FUNCTION, hooks_for
from . import masks
from .attention import dispatch
from .backends.eager import eager_attention
from .call import check_flag, make_call, shape_str
from .sdpa_layout import layout


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    _check_inputs(query, key, value)
    check_flag("is_causal", is_causal)
    check_flag("enable_gqa", enable_gqa)
    dropout_p = _check_dropout(dropout_p)
    align = "top_left" if is_causal else None
    if isinstance(attn_mask, CausalBias):
        if is_causal:
            raise ValueError("CausalBias should not be used with causal=True (as in torch)")
        align = _causal_bias_align(attn_mask, query.shape[-2], key.shape[-2])
        attn_mask = None
    elif attn_mask is not None:
        _check_attn_mask(attn_mask, query, is_causal)
    lay = layout(query, key, value, enable_gqa)
    q, k, v = lay.q, lay.k, lay.v
    if q.shape[0] * q.shape[1] == 0:  # no batch or no heads: an empty output
        return query.sum().mul(0).expand(lay.out)
    mask = bias = None
    if attn_mask is not None:
        mask4 = _fold_mask(attn_mask, lay.scores, lay.batch, lay.heads)
        mask, bias = (mask4, None) if mask4.dtype == torch.bool else (None, mask4)
    causal = align is not None
    L, S = q.shape[2], k.shape[2]
    if align == "top_left" and L != S:
        if L < S and dropout_p == 0.0:
            # Top-left causality never reaches past key L - 1: it is the bottom-right causal
            # mask of the first L keys, which the fused kernel runs without a mask. (With
            # dropout the full mask is kept, so that dropout draws as torch does.)
            k, v = k[:, :, :L], v[:, :, :L]
        else:
            mask, causal = masks.causal(L, S, align="top_left", device=q.device), False
    call = make_call(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=scale,
        dropout_p=0.0 if dropout_p == 1.0 else dropout_p,  # p = 1 is handled below
        qkv_checked=True,  # consistent by construction in `layout`
        scale_rule="finite",
    )
    out, _ = dispatch(call)
    hooks = hooks_for(FUNCTION)  # `capture()` without a model observes bare calls
    if hooks is not None:
        with torch.no_grad():
            _, pattern = eager_attention(call._replace(dropout_p=0.0, return_weights=True))
        assert pattern is not None
        hooks.observe(call, pattern)
    if dropout_p == 1.0:  # torch drops every weight: zeros (with zero gradients)
        out = out * 0.0
    return out.reshape(lay.out)  # (B, H, L, Ev) -> (..., L, Ev)


def _check_inputs(query: object, key: object, value: object) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(
                f"{name} must have at least 2 dimensions (..., L, E), got {shape_str(t)}"
            )
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    assert isinstance(query, Tensor) and isinstance(key, Tensor) and isinstance(value, Tensor)
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, "
            f"{value.dtype}"
        )
    if not (query.device == key.device == value.device):
        raise ValueError(
            f"query, key and value must be on one device, got {query.device}, {key.device}, "
            f"{value.device}"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"query {shape_str(query)} and key {shape_str(key)} must have the same last "
            "dimension (E)"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"key {shape_str(key)} and value {shape_str(value)} must have the same length (dim -2)"
        )


def _check_dropout(dropout_p: object) -> float:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must lie in [0, 1], got {dropout_p}")
    return float(dropout_p)


def _check_attn_mask(attn_mask: object, query: Tensor, is_causal: bool) -> None:
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if is_causal:
        raise ValueError("attn_mask must be None when is_causal=True (as in torch)")
    if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
        raise TypeError(
            "attn_mask must be boolean (True = may attend), float32 or the query's dtype "
            f"({query.dtype}), got {attn_mask.dtype}"
        )
    if attn_mask.device != query.device:
        raise ValueError(f"attn_mask is on {attn_mask.device} but query is on {query.device}")


def _fold_mask(
    attn_mask: Tensor, scores: tuple[int, ...], batch: tuple[int, ...], heads: int
) -> Tensor:
    """A mask broadcastable to torch's score shape -> broadcastable to (B, H, L, S)."""
    try:
        ok = len(attn_mask.shape) <= len(scores) and (
            torch.broadcast_shapes(attn_mask.shape, scores) == torch.Size(scores)
        )
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"attn_mask of shape {shape_str(attn_mask)} does not broadcast to the attention "
            f"scores {scores} (query and key leading dimensions, L, S)"
        )
    if len(batch) <= 1 and attn_mask.dim() <= 4:
        return attn_mask  # right-aligned, it already broadcasts to (B, H, L, S)
    # (..., L, S) -> (B, H, L, S): fold the batch axes as `layout` folded the inputs.
    full = attn_mask.expand(*batch, heads, *scores[-2:])
    return full.reshape(-1, heads, *scores[-2:])


def _causal_bias_align(bias: CausalBias, L: int, S: int) -> str:
    """torch's reading of a CausalBias: upper-left (or equal recorded lengths) is `is_causal`
    on the actual lengths; lower-right is the bottom-right mask of its recorded lengths."""
    if bias.variant == CausalVariant.UPPER_LEFT or bias.seq_len_q == bias.seq_len_kv:
        return "top_left"
    if bias.variant != CausalVariant.LOWER_RIGHT:
        raise ValueError(f"CausalBias.variant must be a CausalVariant, got {bias.variant!r}")
    if (bias.seq_len_q, bias.seq_len_kv) != (L, S):
        raise ValueError(
            f"attn_mask is a lower-right CausalBias for ({bias.seq_len_q}, {bias.seq_len_kv}) "
            f"queries and keys, but the inputs have L={L}, S={S}"
        )
    return "bottom_right"
