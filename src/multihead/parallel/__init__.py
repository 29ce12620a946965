"""Scaling attention past one device on torch.distributed.

- Tensor-parallel heads: `tensor_parallel(model, mesh)` (or `tensor_parallel_plan(model)` with
  `parallelize_module`) splits every attention module's heads and every MLP over a 1-D device
  mesh; `full_state_dict` / `full_grads` put the shards back together.
- Sequence parallelism: `ring_attention` computes exact attention over a sequence sharded across
  the ranks of a process group ("contiguous" or load-balanced "zigzag" chunks);
  `sequence_parallel(model, group)` makes a model's self-attention run that way.
"""

from ..functional.dropout_mask import dropout_keep_mask
from .gather import gather_sequence
from .layout import (
    LAYOUTS,
    Segment,
    layout_segments,
    sequence_positions,
    shard_sequence,
    unshard_sequence,
)
from .ring_attention import ring_attention
from .sequence_parallel import sequence_parallel
from .tensor_parallel import HeadParallel, tensor_parallel, tensor_parallel_plan
from .unshard import full_grads, full_state_dict

__all__ = [
    "LAYOUTS",
    "HeadParallel",
    "Segment",
    "dropout_keep_mask",
    "full_grads",
    "full_state_dict",
    "gather_sequence",
    "layout_segments",
    "ring_attention",
    "sequence_parallel",
    "sequence_positions",
    "shard_sequence",
    "tensor_parallel",
    "tensor_parallel_plan",
    "unshard_sequence",
]
