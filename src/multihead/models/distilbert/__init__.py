"""DistilBERT encoders: BERT's module without token types, its own key names, LayerNorm eps
fixed at 1e-12 (as transformers' DistilBertModel)."""

from ...modules.feedforward import ACTIVATIONS
from ..bert import BertConfig, BertEncoder, renamer
from ..fields import Fields
from ..keymap import Rule, pair
from ..loading import Family


def distilbert_config(config: dict) -> BertConfig:
    f = Fields(config, "distilbert")
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    return BertConfig(
        vocab_size=f.int("vocab_size"),
        hidden_size=f.int("dim"),
        num_hidden_layers=f.int("n_layers"),
        num_attention_heads=f.int("n_heads"),
        intermediate_size=f.int("hidden_dim"),
        hidden_act=f.choice("activation", "gelu", ACTIVATIONS),
        layer_norm_eps=1e-12,
        max_position_embeddings=f.int("max_position_embeddings", 512),
        type_vocab_size=0,
        pad_token_id=f.int("pad_token_id", 0, minimum=0),
        hidden_dropout_prob=f.probability("dropout", 0.1),
        attention_probs_dropout_prob=f.probability("attention_dropout", 0.1),
    )


def distilbert_key_map(config: BertConfig) -> list[Rule]:
    layer = "transformer.layer.{i}"
    return [
        *Rule.same("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight"),
        *pair("embeddings.norm", "embeddings.LayerNorm"),
        *pair("layers.{i}.attn.in_proj", f"{layer}.attention.", cat=("q_lin", "k_lin", "v_lin")),
        *pair("layers.{i}.attn.out_proj", f"{layer}.attention.out_lin"),
        *pair("layers.{i}.norm1", f"{layer}.sa_layer_norm"),
        *pair("layers.{i}.ffn.fc1", f"{layer}.ffn.lin1"),
        *pair("layers.{i}.ffn.fc2", f"{layer}.ffn.lin2"),
        *pair("layers.{i}.norm2", f"{layer}.output_layer_norm"),
    ]


# The masked-LM and task heads, and the position-id buffer.
DISTILBERT_IGNORED = (
    "vocab_transform.",
    "vocab_layer_norm.",
    "vocab_projector.",
    "pre_classifier.",
    "classifier.",
    "qa_outputs.",
    "embeddings.position_ids",
)

DISTILBERT = Family(
    read_config=distilbert_config,
    build=BertEncoder,
    key_map=distilbert_key_map,
    num_layers=lambda config: config.num_hidden_layers,
    rename=renamer("distilbert."),
    ignored=DISTILBERT_IGNORED,
)

__all__ = ["DISTILBERT", "distilbert_config", "distilbert_key_map"]
