"""Our CausalLM parameters <- Hugging Face GPTNeoXForCausalLM keys (after 'gpt_neox.').

query_key_value holds each head's q, k and v rows together ((H, 3, D) rows): `gpt_neox_view`
presents them as query / key / value tensors of (H * D) rows each, which the key map stacks
into our packed q|k|v projection."""

from __future__ import annotations

from ...modules.lm import LMConfig
from ..checkpoint import Checkpoint
from ..keymap import Rule, pair
from ..view import CheckpointView, Part

_QKV = "attention.query_key_value"


def gpt_neox_key_map(config: LMConfig) -> list[Rule]:
    layer = "layers.{i}"
    rules = [
        Rule("tok.weight", ("embed_in.weight",)),
        *pair("layers.{i}.norm1", f"{layer}.input_layernorm"),
        *pair(
            "layers.{i}.attn.in_proj",
            f"{layer}.attention.",
            cat=("query", "key", "value"),
            bias=bool(config.qkv_bias),
        ),
        *pair("layers.{i}.attn.out_proj", f"{layer}.attention.dense", bias=bool(config.out_bias)),
        *pair("layers.{i}.norm2", f"{layer}.post_attention_layernorm"),
        *pair("layers.{i}.ffn.fc1", f"{layer}.mlp.dense_h_to_4h"),
        *pair("layers.{i}.ffn.fc2", f"{layer}.mlp.dense_4h_to_h"),
        *pair("norm_f", "final_layer_norm"),
    ]
    if not config.tie_embeddings:
        rules.append(Rule("head.weight", ("embed_out.weight",)))
    return rules


def gpt_neox_view(checkpoint: Checkpoint, config: LMConfig) -> Checkpoint:
    """Each layer's per-head interleaved query_key_value as query, key and value."""
    H = config.num_heads
    D = config.dim // H
    parts: dict[str, Part] = {}
    for key in checkpoint.infos:
        stem, _, kind = key.rpartition(".")
        if not stem.endswith(_QKV):
            continue
        prefix = stem.removesuffix("query_key_value")
        for j, name in enumerate(("query", "key", "value")):
            # rows (H, 3, D): head h's part j is rows h*3D + j*D .. + D
            rows = tuple(h * 3 * D + j * D + d for h in range(H) for d in range(D))
            parts[f"{prefix}{name}.{kind}"] = Part(key, rows)
    return CheckpointView(checkpoint, parts)


def gpt_neox_rename(key: str) -> str | None:
    return key.removeprefix("gpt_neox.")


# causal-mask and RoPE buffers older checkpoints carry; the head when tied
GPT_NEOX_IGNORED = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq",
                    "embed_out.weight")  # fmt: skip
