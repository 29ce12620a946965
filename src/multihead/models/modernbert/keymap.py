"""Our ModernBertEncoder parameters <- Hugging Face ModernBertModel keys (after the optional
'model.' prefix of ModernBertForMaskedLM and the task models). Wi holds the GeGLU's two
halves stacked (rows: the activated input | the gate it multiplies), presented by a view as
Wi_act and Wi_lin."""

from __future__ import annotations

from ..checkpoint import Checkpoint
from ..keymap import Rule, pair
from ..view import CheckpointView, Part, row_range
from .config import ModernBertConfig


def modernbert_key_map(config: ModernBertConfig) -> list[Rule]:
    layer = "layers.{i}"
    norm, attn, mlp = config.norm_bias, config.attention_bias, config.mlp_bias
    rules = [
        Rule("embeddings.word_embeddings.weight", ("embeddings.tok_embeddings.weight",)),
        *pair("embeddings.norm", "embeddings.norm", bias=norm),
        *pair("final_norm", "final_norm", bias=norm),
        # Wqkv's rows are q | k | v, as our packed in_proj
        *pair("layers.{i}.attn.in_proj", f"{layer}.attn.Wqkv", bias=attn),
        *pair("layers.{i}.attn.out_proj", f"{layer}.attn.Wo", bias=attn),
        *pair("layers.{i}.norm2", f"{layer}.mlp_norm", bias=norm),
        *pair("layers.{i}.ffn.gate", f"{layer}.mlp.Wi_act", bias=mlp),
        *pair("layers.{i}.ffn.up", f"{layer}.mlp.Wi_lin", bias=mlp),
        *pair("layers.{i}.ffn.down", f"{layer}.mlp.Wo", bias=mlp),
    ]
    for i in range(1, config.num_hidden_layers):  # layer 0 has no attn_norm
        rules += pair(f"layers.{i}.norm1", f"layers.{i}.attn_norm", bias=norm)
    return rules


def modernbert_view(checkpoint: Checkpoint, config: ModernBertConfig) -> Checkpoint:
    """mlp.Wi (2F rows) as mlp.Wi_act (rows 0..F) and mlp.Wi_lin (rows F..2F)."""
    F = config.intermediate_size
    parts: dict[str, Part] = {}
    for key in checkpoint.infos:
        stem, _, kind = key.rpartition(".")
        if stem.endswith("mlp.Wi"):
            parts[f"{stem}_act.{kind}"] = row_range(key, 0, F)
            parts[f"{stem}_lin.{kind}"] = row_range(key, F, 2 * F)
    return CheckpointView(checkpoint, parts)


def modernbert_rename(key: str) -> str | None:
    return key.removeprefix("model.")


# Not the encoder: the MLM head and decoder, task heads.
MODERNBERT_IGNORED = ("head.", "decoder.", "classifier.", "qa_outputs.", "drop.")
