"""The input projections of multi-head attention, shared by `MultiHeadAttention` and the
`torch.nn.MultiheadAttention` drop-in.

Two weight layouts:
- packed: one (Wq | Wk | Wv) matrix of shape (q_width + 2 * kv_width, C), rows ordered q, k, v:
  self-attention is one fused matmul; cross-attention uses row slices (views, no copy), and one
  matmul for k and v together when key and value are the same tensor;
- separate: three projections (kdim / vdim other than the query width).

Outputs keep the inputs' layout: (B, T, width) or (T, B, width); the caller splits heads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

Projection = Callable[[Tensor], Tensor]


def _plain(layer: nn.Module) -> bool:
    """An nn.Linear whose forward is exactly F.linear on plain tensors: no hooks of its own, no
    global module hooks, no tensor subclass (DTensor) weight."""
    return (
        type(layer) is nn.Linear
        and not layer._forward_hooks
        and not layer._forward_pre_hooks
        and not _module._global_forward_hooks
        and not _module._global_forward_pre_hooks
        and type(layer.weight) is nn.Parameter
    )


def linear(layer: nn.Module, x: Tensor) -> Tensor:
    """`layer(x)`, minus Module.__call__ when that adds nothing (~7 us per call, a sixth of a
    whole attention layer at small shapes). Layers with hooks, sharded (DTensor) weights or
    another type (LoRA, quantized) run through their own `__call__`, so hooks fire and torch's
    tensor-parallel styles apply."""
    if _plain(layer):
        return F.linear(x, layer.weight, layer.bias)  # type: ignore[arg-type]
    return layer(x)


class PackedWeights(NamedTuple):
    """A packed (q | k | v) projection: `weight` (q_width + 2 kv_width, C), `bias` or None.
    `fused(x)` runs the whole projection (for self-attention) and may go through a module."""

    weight: Tensor
    bias: Tensor | None
    fused: Projection


def packed_query(packed: PackedWeights, q_width: int, query: Tensor) -> Tensor:
    """query (..., C) -> q (..., q_width) from the q rows of a packed weight (views)."""
    bias = None if packed.bias is None else packed.bias[:q_width]
    return F.linear(query, packed.weight[:q_width], bias)


def packed_key_value(
    packed: PackedWeights, widths: tuple[int, int, int], key: Tensor, value: Tensor
) -> tuple[Tensor, Tensor]:
    """key, value (..., C) -> k, v (..., kv_width) from the k and v rows of a packed weight."""
    q_width = widths[0]
    weight, bias = packed.weight, packed.bias
    if key is value:
        # The k and v rows are adjacent in the packed weight: one matmul for both.
        kv = F.linear(key, weight[q_width:], None if bias is None else bias[q_width:])
        k, v = kv.split(widths[1:], dim=-1)
        return k, v
    _, wk, wv = weight.split(widths)
    bk, bv = (None, None) if bias is None else bias.split(widths)[1:]
    return F.linear(key, wk, bk), F.linear(value, wv, bv)


def project_packed(
    packed: PackedWeights,
    widths: tuple[int, int, int],
    query: Tensor,
    key: Tensor,
    value: Tensor,
    self_attention: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(..., C) inputs -> q (..., q_width), k and v (..., kv_width) with a packed weight."""
    if self_attention:
        qkv = packed.fused(query)  # (..., q_width + 2 kv_width): one fused matmul
        q, k, v = qkv.split(widths, dim=-1)
        return q, k, v
    q = packed_query(packed, widths[0], query)
    k, v = packed_key_value(packed, widths, key, value)
    return q, k, v


def project_separate(
    projections: tuple[Projection, Projection, Projection],
    query: Tensor,
    key: Tensor,
    value: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """(..., C), (..., kdim), (..., vdim) -> q, k, v through three projections."""
    q_proj, k_proj, v_proj = projections
    return q_proj(query), k_proj(key), v_proj(value)
