"""The autograd-aware collectives of tensor-parallel heads (Megatron-LM's f and friends), on plain
tensors over a process group; the same code runs on gloo (CPU) and NCCL (CUDA).

- `copy_to_ranks` (Megatron's f): identity forward; backward all-reduces the gradient, because
  every rank's heads read the same replicated input and each contributes part of its gradient.
- `sum_replica_grads`: identity forward on a weight; backward sums the gradient rows of kv heads
  that several ranks hold (grouped-query attention with fewer kv heads than ranks), so every
  replica gets the whole gradient and replicas stay equal under any optimizer.
- `gather_heads`: all-gather along the head dimension (attention weights of every head);
  backward keeps this rank's slice (what follows is replicated on every rank).

Shapes: x any; weight rows (n, C); heads (B, H/tp, Tq, Tk) -> (B, H, Tq, Tk).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .heads import HeadSplit


class _CopyToRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.clone(memory_format=torch.contiguous_format)  # never write into autograd's
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def copy_to_ranks(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """x, used by every rank's shard of a layer: the same values, gradients summed over ranks."""
    return _CopyToRanks.apply(x, group)


class _SumReplicaGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: Tensor, rows: slice, split: HeadSplit, group) -> Tensor:
        ctx.rows, ctx.split, ctx.group = rows, split, group
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad: Tensor):
        split: HeadSplit = ctx.split
        grad = grad.clone(memory_format=torch.contiguous_format)
        mine = grad[ctx.rows]  # (rows of this rank's kv head, ...)
        # One slot per kv head: each rank adds its part into its head's slot; one all-reduce
        # over the tensor-parallel group sums the replicas (no sub-groups needed).
        slots = mine.new_zeros(split.num_kv_heads, *mine.shape)
        head = split.kv_heads().start
        slots[head] = mine
        dist.all_reduce(slots, group=ctx.group)
        grad[ctx.rows] = slots[head]
        return grad, None, None, None


def sum_replica_grads(w: Tensor, rows: slice, split: HeadSplit, group: dist.ProcessGroup) -> Tensor:
    """`w` as it is; in backward the gradient of `w[rows]` (a replicated kv head's rows) is
    summed over the ranks that hold the same head."""
    return _SumReplicaGrads.apply(w, rows, split, group)


class _GatherHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        ctx.rank, ctx.heads = dist.get_rank(group), x.shape[1]
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=1)  # (B, h, ...) per rank -> (B, tp * h, ...)

    @staticmethod
    def backward(ctx, grad: Tensor):
        start = ctx.rank * ctx.heads
        return grad[:, start : start + ctx.heads], None


def gather_heads(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """(B, H/tp, ...) on every rank -> (B, H, ...), heads in rank order."""
    return _GatherHeads.apply(x, group)
