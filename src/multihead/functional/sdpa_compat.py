"""`scaled_dot_product_attention`: torch's signature and semantics, minus the NaN rows.

Same as `torch.nn.functional.scaled_dot_product_attention` (boolean `attn_mask` True = may attend,
float masks added, `is_causal` aligned top-left, any leading batch dims `(..., L, E)`), except that
a query row with no allowed key returns zeros instead of NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import masks
from .attention import attention


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
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (L, E), got {tuple(t.shape)}")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask must be None when is_causal=True (as in torch)")
    if query.dim() != key.dim() or key.dim() != value.dim():
        raise ValueError(
            f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} "
            "must have the same number of dimensions"
        )
    if query.dim() >= 3 and query.shape[-3] != key.shape[-3] and not enable_gqa:
        raise ValueError(
            f"query heads ({query.shape[-3]}) and key heads ({key.shape[-3]}) differ; "
            "pass enable_gqa=True for grouped-query attention"
        )
    # (..., L, E) -> (B, H, L, E): keep the head axis (-3) for grouped-query attention and fold
    # every axis before it into the batch.
    lead_q = query.shape[:-2]
    q4, k4, v4 = (_to_4d(t) for t in (query, key, value))
    tq, tk = query.shape[-2], key.shape[-2]
    mask = bias = None
    if attn_mask is not None:
        full = torch.Size((*torch.broadcast_shapes(lead_q, key.shape[:-2]), tq, tk))
        try:
            expanded = attn_mask.expand(full) if query.dim() > 4 else attn_mask
        except RuntimeError:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {tuple(full)}"
            ) from None
        if expanded.dim() > 4:
            expanded = expanded.reshape(-1, *expanded.shape[-3:])
        if attn_mask.dtype == torch.bool:
            mask = expanded
        else:
            bias = expanded
    if is_causal:
        mask = masks.causal(tq, tk, align="top_left", device=query.device)
    out = attention(q4, k4, v4, mask=mask, bias=bias, scale=scale, dropout_p=dropout_p)
    return out.reshape(*lead_q, tq, value.shape[-1])  # (B, H, L, Ev) -> (..., L, Ev)


def _to_4d(t: Tensor) -> Tensor:
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[None]
    return t.reshape(-1, *t.shape[-3:])
