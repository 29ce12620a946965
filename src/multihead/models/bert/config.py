"""The configuration of BERT-family encoders (BERT, RoBERTa / XLM-R, DistilBERT all build a
BertEncoder from it) and BERT's config.json reader."""

from __future__ import annotations

from dataclasses import dataclass

from ...modules.feedforward import ACTIVATIONS
from ..fields import Fields

POSITION_STYLES = ("bert", "roberta")


@dataclass(frozen=True)
class BertConfig:
    """Field names as BERT's config.json. `type_vocab_size` 0: no token types (DistilBERT).
    `position_style`: "bert" (token i at position i) or "roberta" (positions count the
    non-padding tokens, starting at pad_token_id + 1; padding sits at pad_token_id)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    pad_token_id: int = 0
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    position_style: str = "bert"
    embedding_size: int | None = None  # ELECTRA: embeddings this wide, projected to hidden_size

    def __post_init__(self) -> None:
        if self.position_style not in POSITION_STYLES:
            raise ValueError(
                f"position_style must be one of {POSITION_STYLES}, got {self.position_style!r}"
            )
        if self.hidden_act not in ACTIVATIONS:
            known = ", ".join(sorted(ACTIVATIONS))
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}; known: {known}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.max_length < 1:
            raise ValueError(
                f"max_position_embeddings {self.max_position_embeddings} leaves no position "
                f"for tokens after the padding offset (pad_token_id {self.pad_token_id})"
            )

    @property
    def max_length(self) -> int:
        """The longest sequence the position table holds."""
        offset = self.pad_token_id + 1 if self.position_style == "roberta" else 0
        return self.max_position_embeddings - offset

    @classmethod
    def from_dict(cls, config: dict) -> BertConfig:
        """From a Hugging Face BERT config.json; ValueError naming what is unsupported."""
        return bert_config(config)


def bert_like_config(f: Fields, *, pad_default: int, position_style: str) -> BertConfig:
    """BERT and RoBERTa share every field name."""
    f.refuse(
        "position_embedding_type",
        lambda v: v == "absolute",
        "only 'absolute' is supported (relative_key / relative_key_query are not)",
    )
    f.refuse("is_decoder", lambda v: v is False, "a causal (decoder) BERT is not supported")
    f.refuse("quantization_config", lambda v: not v, "quantized weights are not supported")
    return BertConfig(
        **bert_fields(f),
        type_vocab_size=f.int("type_vocab_size", 2),
        pad_token_id=f.int("pad_token_id", pad_default, minimum=0),
        position_style=position_style,
    )


def bert_fields(f: Fields) -> dict:
    """The sizes, activation, norm epsilon and dropouts, under the names (and defaults) that
    BERT, RoBERTa and MPNet configs share."""
    return dict(
        vocab_size=f.int("vocab_size"),
        hidden_size=f.int("hidden_size"),
        num_hidden_layers=f.int("num_hidden_layers"),
        num_attention_heads=f.int("num_attention_heads"),
        intermediate_size=f.int("intermediate_size"),
        hidden_act=f.choice("hidden_act", "gelu", ACTIVATIONS),
        layer_norm_eps=f.epsilon("layer_norm_eps", 1e-12),
        max_position_embeddings=f.int("max_position_embeddings", 512),
        hidden_dropout_prob=f.probability("hidden_dropout_prob", 0.1),
        attention_probs_dropout_prob=f.probability("attention_probs_dropout_prob", 0.1),
    )


def bert_config(config: dict) -> BertConfig:
    return bert_like_config(Fields(config, "bert"), pad_default=0, position_style="bert")
