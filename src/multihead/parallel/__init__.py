"""Scaling attention past one device on torch.distributed.

`ring_attention`: exact attention over a sequence sharded across the ranks of a process group,
with helpers to shard a sequence ("contiguous" or load-balanced "zigzag") and put it back.
"""

from .dropout import dropout_keep_mask
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

__all__ = [
    "LAYOUTS",
    "Segment",
    "dropout_keep_mask",
    "gather_sequence",
    "layout_segments",
    "ring_attention",
    "sequence_positions",
    "shard_sequence",
    "unshard_sequence",
]
