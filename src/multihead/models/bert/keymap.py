"""Our BertEncoder parameters <- Hugging Face BertModel keys (after the optional 'bert.'
prefix; old checkpoints' LayerNorm gamma/beta renamed weight/bias)."""

from __future__ import annotations

from ..keymap import Rule, pair
from .config import BertConfig


def bert_key_map(config: BertConfig) -> list[Rule]:
    """BERT's names, which RoBERTa and XLM-R share."""
    layer = "encoder.layer.{i}"
    width = config.embedding_size or config.hidden_size
    project = (
        pair("embeddings_project", "embeddings_project") if width != config.hidden_size else []
    )
    return [
        *project,
        *Rule.same("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight"),
        *Rule.same("embeddings.token_type_embeddings.weight"),
        *pair("embeddings.norm", "embeddings.LayerNorm"),
        # query, key and value rows stacked into one packed projection: one matmul per layer
        *pair(
            "layers.{i}.attn.in_proj", f"{layer}.attention.self", cat=(".query", ".key", ".value")
        ),
        *pair("layers.{i}.attn.out_proj", f"{layer}.attention.output.dense"),
        *pair("layers.{i}.norm1", f"{layer}.attention.output.LayerNorm"),
        *pair("layers.{i}.ffn.fc1", f"{layer}.intermediate.dense"),
        *pair("layers.{i}.ffn.fc2", f"{layer}.output.dense"),
        *pair("layers.{i}.norm2", f"{layer}.output.LayerNorm"),
    ]


# Present in BERT checkpoints but not part of the encoder: the pooler and task heads (unused),
# and the position-id / token-type buffers.
BERT_IGNORED = ("pooler.", "cls.", "embeddings.position_ids", "embeddings.token_type_ids")


def renamer(prefix: str):
    """Drop `prefix` (the task models' 'bert.', 'roberta.', ...) and rename old LayerNorm
    gamma/beta to weight/bias."""

    def rename(key: str) -> str | None:
        key = key.removeprefix(prefix)
        if key.endswith("LayerNorm.gamma"):
            return key[: -len("gamma")] + "weight"
        if key.endswith("LayerNorm.beta"):
            return key[: -len("beta")] + "bias"
        return key

    return rename
