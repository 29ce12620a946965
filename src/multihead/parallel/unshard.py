"""Full (unsharded) parameters and gradients of a tensor-parallel (and FSDP-sharded) model, keyed
as the unsharded model names them: to save a checkpoint that loads into one process, or to check
a sharded run against one. Collectives: every rank of the model's groups must call them.

DTensor parameters (torch's styles, FSDP2) come back with `full_tensor()`; the head shards of
`HeadParallel` (plain local tensors, or FSDP2's DTensors over the data-parallel mesh holding
them) are all-gathered over the tensor-parallel group and put back in the full layout: q | k | v
rows for `in_proj`, a replicated kv head taken once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from .linear_shards import TensorParallelHeads

Assemble = Callable[[list[Tensor]], Tensor]


def _head_sharded(model: nn.Module) -> dict[str, tuple[TensorParallelHeads, Assemble]]:
    """{parameter name: (its module's split, how to assemble the full tensor from the shards)}."""
    out: dict[str, tuple[TensorParallelHeads, Assemble]] = {}
    for name, module in model.named_modules():
        heads = getattr(module, "_tensor_parallel", None)
        if not isinstance(heads, TensorParallelHeads):
            continue
        dot = f"{name}." if name else ""
        split = heads.split
        projections: dict[str, Assemble] = (
            {"in_proj": split.full_packed}
            if heads.packed
            else {"q_proj": split.full_query, "k_proj": split.full_kv, "v_proj": split.full_kv}
        )
        for proj, assemble in projections.items():
            for kind in ("weight", "bias"):
                out[f"{dot}{proj}.{kind}"] = (heads, assemble)
    return out


def _gather_shards(local: Tensor, group: dist.ProcessGroup) -> list[Tensor]:
    local = local.contiguous()
    shards = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, local, group=group)
    return shards


def _full(items: Iterable[tuple[str, Tensor | None]], model: nn.Module) -> dict[str, Tensor | None]:
    sharded = _head_sharded(model)
    out: dict[str, Tensor | None] = {}
    for name, t in items:
        if t is None:
            out[name] = None
            continue
        local = t.full_tensor() if isinstance(t, DTensor) else t
        local = local.detach()
        if name in sharded:
            heads, assemble = sharded[name]
            local = assemble(_gather_shards(local, heads.group))
        out[name] = local
    return out


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The model's state_dict at full size (loads into the unsharded model). A collective."""
    full = _full(model.state_dict().items(), model)
    return {k: v for k, v in full.items() if v is not None}


def full_grads(model: nn.Module) -> dict[str, Tensor | None]:
    """{parameter name: its gradient at full size, or None}. A collective."""
    return _full(((n, p.grad) for n, p in model.named_parameters()), model)
