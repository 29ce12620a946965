"""MPNet encoders (all-mpnet-base-v2 and the like): config reader, key map and module.

Positions follow transformers' MPNetEmbeddings: RoBERTa's convention with the padding id fixed
at 1 (real tokens count from 2, so 514 positions hold 512 tokens), whatever config.json's
pad_token_id says; a config whose pad_token_id is not 1 is refused rather than half-followed.
"""

from ..bert import BERT_IGNORED, renamer
from ..bert.config import bert_fields
from ..fields import Fields
from ..keymap import Rule, pair
from ..loading import Family
from .model import MPNetConfig, MPNetEncoder

PADDING_ID = 1  # transformers' MPNetEmbeddings.padding_idx, a constant there
BUCKETS = 32  # transformers' MPNetEncoder.compute_position_bias(num_buckets=32), a constant


def mpnet_config(config: dict) -> MPNetConfig:
    f = Fields(config, "mpnet")
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    f.refuse(
        "pad_token_id",
        lambda v: v is None or v == PADDING_ID,
        f"transformers' MPNet counts positions from padding id {PADDING_ID} whatever this says",
    )
    f.refuse(
        "relative_attention_num_buckets",
        lambda v: v == BUCKETS,
        f"transformers' MPNet buckets distances into {BUCKETS} buckets whatever this says, so a "
        "table of another size is ambiguous",
    )
    return MPNetConfig(
        **bert_fields(f),
        type_vocab_size=0,
        pad_token_id=PADDING_ID,
        position_style="roberta",
        relative_attention_num_buckets=BUCKETS,
    )


def mpnet_key_map(config: MPNetConfig) -> list[Rule]:
    """Our MPNetEncoder <- Hugging Face MPNetModel keys (after the optional 'mpnet.' prefix)."""
    layer = "encoder.layer.{i}"
    return [
        *Rule.same("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight"),
        *pair("embeddings.norm", "embeddings.LayerNorm"),
        # q, k and v rows stacked into one packed projection: one matmul per layer
        *pair("layers.{i}.attn.in_proj", f"{layer}.attention.attn.", cat=("q", "k", "v")),
        *pair("layers.{i}.attn.out_proj", f"{layer}.attention.attn.o"),
        *pair("layers.{i}.norm1", f"{layer}.attention.LayerNorm"),
        *pair("layers.{i}.ffn.fc1", f"{layer}.intermediate.dense"),
        *pair("layers.{i}.ffn.fc2", f"{layer}.output.dense"),
        *pair("layers.{i}.norm2", f"{layer}.output.LayerNorm"),
        # the one table every layer shares: once here, once in the checkpoint
        Rule("relative_attention_bias.weight", ("encoder.relative_attention_bias.weight",)),
    ]


MPNET = Family(
    read_config=mpnet_config,
    build=MPNetEncoder,
    key_map=mpnet_key_map,
    num_layers=lambda config: config.num_hidden_layers,
    rename=renamer("mpnet."),
    # the pooler, the masked-LM and task heads, the position-id buffer
    ignored=(*BERT_IGNORED, "lm_head.", "classifier.", "qa_outputs."),
)

__all__ = ["MPNET", "MPNetConfig", "MPNetEncoder", "mpnet_config", "mpnet_key_map"]
