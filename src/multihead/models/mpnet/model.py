"""MPNet encoders: BERT's post-norm blocks and RoBERTa's positions, plus a relative position
bias (T5 buckets, bidirectional) from one table that every layer shares.

The table is registered once, as `relative_attention_bias` on the encoder (so it is one
parameter, once in `state_dict()`, as in Hugging Face's checkpoints); each layer's attention
holds a `SharedPosition` view of it and asks it for its bias through the `PositionScheme`
protocol. Each layer computes the (1, H, T, T) bias from the table: cheap next to the
attention it is added to (H * T * T reads per layer), and no state lives between calls.

Shapes: input_ids (B, T) -> hidden states (B, T, C); packed input_ids (N,) -> (N, C).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...positional.relative import RelativePositionBias
from ..bert import BertConfig, BertEncoder


@dataclass(frozen=True)
class MPNetConfig(BertConfig):
    """BertConfig with RoBERTa's positions, no token types, and the relative bias's buckets.
    transformers' MPNet buckets distances into 32 buckets up to 128 whatever the config says
    (its `relative_attention_num_buckets` only sizes the table), so these are what it sets."""

    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128


class MPNetEncoder(BertEncoder):
    """An MPNet encoder: `BertEncoder` whose layers add the shared relative position bias.
    Hook points as BertEncoder (hook_embed, hook_pos_embed, blocks.{i}.*)."""

    def __init__(self, config: MPNetConfig, device=None, dtype=None) -> None:
        table = RelativePositionBias(
            config.num_attention_heads,
            num_buckets=config.relative_attention_num_buckets,
            max_distance=config.relative_attention_max_distance,
            bidirectional=True,
            device=device,
            dtype=dtype,
        )
        super().__init__(config, device=device, dtype=dtype, position=table.shared)
        self.relative_attention_bias = table  # the one registration of the shared table
