"""The input projections of multi-head attention, shared by `MultiHeadAttention` and the
`torch.nn.MultiheadAttention` drop-in.

Two weight layouts:
- packed: one (Wq | Wk | Wv) matrix of shape ((H + 2 Hkv) D, C), rows ordered q, k, v:
  self-attention is one fused matmul; cross-attention uses row slices (views, no copy), and one
  matmul for k and v together when key and value are the same tensor;
- separate: three projections (kdim / vdim other than the query width).

Inputs are (B, T, C) (`batch_first`) or (T, B, C); outputs are heads-first (B, n, T, D) views.
A fused output is viewed per head *before* it is split: views of the pieces of a split (a
multi-output view) cost several times more per call, which shows at small shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

from .module_call import bare
from .quantized.linear import weight_like

Projection = Callable[[Tensor], Tensor]
_LINEAR_FORWARD = nn.Linear.forward


def _plain(layer: nn.Module) -> bool:
    """An nn.Linear (or a subclass keeping its forward) that is exactly F.linear on plain
    tensors: no forward set on the instance (accelerate's hooks replace `module.forward`), no
    hooks of its own, no global module hooks, no tensor-subclass (DTensor) weight."""
    return (
        type(layer).forward is _LINEAR_FORWARD
        and "forward" not in layer.__dict__
        and not layer._forward_hooks
        and not layer._forward_pre_hooks
        and not _module._global_forward_hooks
        and not _module._global_forward_pre_hooks
        # (a parametrized weight, torch.nn.utils.parametrize, is not in _parameters)
        and type(layer._parameters.get("weight")) is nn.Parameter
    )


def plain_pair(first: nn.Module, second: nn.Module) -> bool:
    """`_plain(first) and _plain(second)`, in one call and one look at the global hooks (a
    module's hot path tests its two projections per call)."""
    return (
        not _module._global_forward_hooks
        and not _module._global_forward_pre_hooks
        and type(first).forward is _LINEAR_FORWARD
        and type(second).forward is _LINEAR_FORWARD
        and "forward" not in first.__dict__
        and "forward" not in second.__dict__
        and not first._forward_hooks
        and not first._forward_pre_hooks
        and not second._forward_hooks
        and not second._forward_pre_hooks
        and type(first._parameters.get("weight")) is nn.Parameter
        and type(second._parameters.get("weight")) is nn.Parameter
    )


def linear(layer: nn.Module, x: Tensor) -> Tensor:
    """`layer(x)`, minus Module.__call__ when that adds nothing (~7 us per call, a sixth of a
    whole attention layer at small shapes). Layers with hooks, sharded (DTensor) weights or
    another forward (LoRA, quantized) run through their own `__call__`, so hooks fire and
    torch's tensor-parallel styles apply."""
    if _plain(layer):
        params = layer._parameters
        return F.linear(x, params["weight"], params["bias"])  # type: ignore[arg-type]
    if bare(layer):  # (a packed quantized layer: its forward, without Module.__call__)
        return layer.forward(x)
    return layer(x)


def heads_first(x: Tensor, heads: int, batch_first: bool = True) -> Tensor:
    """(B, T, n * D) -> (B, n, T, D), or from (T, B, n * D) with `batch_first=False`; a view."""
    if batch_first:
        B, T, width = x.shape
        return x.view(B, T, heads, width // heads).transpose(1, 2)
    T, B, width = x.shape
    return x.view(T, B, heads, width // heads).permute(1, 2, 0, 3)


def split_fused(x: Tensor, heads: tuple[int, ...], batch_first: bool = True) -> tuple[Tensor, ...]:
    """A fused projection (B, T, sum(heads) * D) -> one heads-first (B, n, T, D) view per entry
    of `heads` (e.g. (H, Hkv, Hkv) for q, k, v)."""
    return tuple(heads_first(x, sum(heads), batch_first).split_with_sizes(heads, dim=1))


class PackedWeights(NamedTuple):
    """A packed (q | k | v) projection: `weight` ((H + 2 Hkv) D, C), `bias` or None, and
    `fused(x)`, the whole projection (for self-attention; it may go through a module)."""

    weight: Tensor
    bias: Tensor | None
    fused: Projection


def project_packed(
    packed: PackedWeights,
    heads: tuple[int, int],
    query: Tensor,
    key: Tensor,
    value: Tensor,
    self_attention: bool,
    batch_first: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """Inputs (..., C) -> q (B, H, Tq, D), k and v (B, Hkv, Tk, D) with a packed weight;
    `heads` = (H, Hkv)."""
    H, Hkv = heads
    if self_attention:
        q, k, v = split_fused(packed.fused(query), (H, Hkv, Hkv), batch_first)
        return q, k, v
    q = heads_first(packed_query(packed, heads, query), H, batch_first)
    k, v = packed_key_value(packed, heads, key, value, batch_first)
    return q, k, v


def packed_rows(packed: PackedWeights, heads: tuple[int, int]) -> tuple[int, int]:
    """(q rows, kv rows) of a packed weight holding H query and 2 Hkv key/value heads."""
    H, Hkv = heads
    head_dim = packed.weight.shape[0] // (H + 2 * Hkv)
    return H * head_dim, Hkv * head_dim


def packed_query(packed: PackedWeights, heads: tuple[int, int], query: Tensor) -> Tensor:
    """query (..., C) -> q (..., H * D) from the q rows of a packed weight (views)."""
    q_rows, _ = packed_rows(packed, heads)
    bias = None if packed.bias is None else packed.bias[:q_rows]
    return F.linear(query, packed.weight[:q_rows], bias)


def packed_key_value(
    packed: PackedWeights,
    heads: tuple[int, int],
    key: Tensor,
    value: Tensor,
    batch_first: bool = True,
) -> tuple[Tensor, Tensor]:
    """key, value (..., C) -> k, v (B, Hkv, Tk, D) from the k and v rows of a packed weight."""
    Hkv = heads[1]
    q_rows, kv_rows = packed_rows(packed, heads)
    weight, bias = packed.weight, packed.bias
    if key is value:
        # The k and v rows are adjacent in the packed weight: one matmul for both.
        kv = F.linear(key, weight[q_rows:], None if bias is None else bias[q_rows:])
        k, v = split_fused(kv, (Hkv, Hkv), batch_first)
        return k, v
    k_rows = slice(q_rows, q_rows + kv_rows)
    v_rows = slice(q_rows + kv_rows, None)
    k = F.linear(key, weight[k_rows], None if bias is None else bias[k_rows])
    v = F.linear(value, weight[v_rows], None if bias is None else bias[v_rows])
    return heads_first(k, Hkv, batch_first), heads_first(v, Hkv, batch_first)


def submodule(module: nn.Module, name: str) -> nn.Module:
    """A registered submodule straight from `_modules` (Module.__getattr__ costs ~0.8 us a
    lookup, a tenth of the module's own time per call at small shapes)."""
    # (registered, so never None; a type: ignore, not typing.cast: cast is a call per lookup)
    return module._modules[name]  # type: ignore[return-value]


def weight_of(layer) -> Tensor:
    """A projection's weight (its dtype and device stand for the module's; a packed quantized
    layer gives an empty tensor of its compute dtype and device, without dequantising)."""
    return weight_like(layer)
