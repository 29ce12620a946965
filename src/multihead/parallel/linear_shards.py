"""The Linear layers of tensor-parallel heads: a rank's rows of a projection as an ordinary
nn.Linear, or as `ReplicatedKVLinear` when other ranks hold the same kv head; and torch's
column/row-parallel styles on weights stored row-major first.

Shapes: a weight (out, in) -> this rank's rows (out_r, in); x (..., in) -> (..., out_r).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from .collectives import sum_replica_grads
from .heads import HeadSplit


@dataclass(frozen=True)
class TensorParallelHeads:
    """What `HeadParallel` did to one attention module (kept on it as `_tensor_parallel`)."""

    split: HeadSplit
    group: dist.ProcessGroup
    packed: bool  # one in_proj (q | k | v), or q_proj / k_proj / v_proj


class ReplicatedKVLinear(nn.Linear):
    """A column shard holding a kv head that other ranks hold too (grouped-query attention with
    fewer kv heads than ranks): the forward sums the gradient of those rows over the replicas."""

    def __init__(self, like: nn.Linear, shard: tuple[Tensor, Tensor | None], rows: slice,
                 heads: TensorParallelHeads) -> None:  # fmt: skip
        weight, bias = shard
        super().__init__(weight.shape[1], weight.shape[0], bias=bias is not None,
                         device="meta", dtype=weight.dtype)  # fmt: skip
        set_parameters(self, like, weight, bias)
        self.kv_rows, self.heads = rows, heads

    def forward(self, x: Tensor) -> Tensor:
        w: Tensor = self.weight
        b: Tensor | None = self.bias
        if torch.is_grad_enabled():
            split, group = self.heads.split, self.heads.group
            w = sum_replica_grads(w, self.kv_rows, split, group)
            b = None if b is None else sum_replica_grads(b, self.kv_rows, split, group)
        return F.linear(x, w, b)


def linear_shard(linear: nn.Module, rows: Tensor) -> tuple[Tensor, Tensor | None]:
    """This rank's rows of a Linear's weight and bias: row-major copies (the full weight can be
    freed; FSDP2 shards only contiguous parameters, and CausalLM stores its matrices
    column-major for decoding)."""
    w = cast(Tensor, linear.weight).detach().index_select(0, rows).contiguous()
    b = linear.bias
    return w, None if b is None else cast(Tensor, b).detach().index_select(0, rows)


def set_parameters(layer: nn.Linear, like: nn.Linear, weight: Tensor, bias: Tensor | None):
    layer.weight = nn.Parameter(weight, requires_grad=like.weight.requires_grad)
    if bias is not None:
        assert like.bias is not None
        layer.bias = nn.Parameter(bias, requires_grad=like.bias.requires_grad)


def plain_linear(like: nn.Linear, shard: tuple[Tensor, Tensor | None]) -> nn.Linear:
    """An nn.Linear holding `shard` (weight rows, bias) with `like`'s requires_grad."""
    weight, bias = shard
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                    device="meta", dtype=weight.dtype)  # fmt: skip
    set_parameters(out, like, weight, bias)
    return out


def row_major(module: nn.Module) -> None:
    """Store the module's matrices row-major before they are sharded: a DTensor keeps the full
    tensor's strides, and FSDP2 refuses non-contiguous parameters (CausalLM stores its matrices
    column-major for decoding)."""
    with torch.no_grad():
        for p in module.parameters():
            if not p.is_contiguous():
                p.data = p.data.contiguous()


class RowMajorColwise(ColwiseParallel):
    """torch's ColwiseParallel on a Linear whose weight is first stored row-major."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        row_major(module)
        return super()._apply(module, device_mesh)


class RowMajorRowwise(RowwiseParallel):
    """torch's RowwiseParallel on a Linear whose weight is first stored row-major."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        row_major(module)
        return super()._apply(module, device_mesh)
