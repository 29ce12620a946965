"""GPT-NeoX from GGUF (llama.cpp's `gptneox` names and metadata) -> the config.json and Hugging
Face keys that `gpt_neox_config` and `gpt_neox_key_map` read.

llama.cpp's converter regroups query_key_value from per-head [q, k, v] rows into q | k | v
blocks; `Layout(qkv_heads=H)` puts the per-head layout back, so the file is read as the Hugging
Face checkpoint it came from. It writes no RoPE base (llama.cpp assumes 10000, as Pythia uses)."""

from __future__ import annotations

from ..gguf.checkpoint import GGUFNames, Layout
from ..gguf.metadata import Metadata

_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_qkv": "attention.query_key_value",
    "attn_output": "attention.dense",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.dense_h_to_4h",
    "ffn_down": "mlp.dense_4h_to_h",
}
_GLOBAL = {
    "token_embd": "gpt_neox.embed_in",
    "output_norm": "gpt_neox.final_layer_norm",
    "output": "embed_out",
}


def gpt_neox_gguf_config(meta: Metadata, tensor_names: set[str]) -> dict:
    dim, heads = meta.get("embedding_length"), meta.get("attention.head_count")
    head_dim = dim // heads if heads else None
    rotary = meta.get("rope.dimension_count", head_dim)
    return {
        "model_type": "gpt_neox",
        "hidden_size": dim,
        "num_attention_heads": heads,
        "num_hidden_layers": meta.get("block_count"),
        "intermediate_size": meta.get("feed_forward_length"),
        "max_position_embeddings": meta.get("context_length"),
        "layer_norm_eps": meta.get("attention.layer_norm_epsilon", kind=float),
        "rotary_pct": rotary / head_dim if head_dim else 1.0,
        "rotary_emb_base": meta.get("rope.freq_base", 10000.0, kind=float),
        "use_parallel_residual": meta.get("use_parallel_residual", True, kind=bool),
        "vocab_size": meta.get("vocab_size", None) or meta.token_count(),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "gelu",
        "attention_bias": "blk.0.attn_qkv.bias" in tensor_names,
    }


def gpt_neox_gguf_names(meta: Metadata, config: dict) -> GGUFNames:
    heads = config["num_attention_heads"]

    def rename(name: str) -> tuple[str, Layout] | None:
        stem, _, kind = name.rpartition(".")
        parts = stem.split(".")
        if len(parts) == 1 and parts[0] in _GLOBAL:
            return f"{_GLOBAL[parts[0]]}.{kind}", Layout()
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER:
            fused = parts[2] == "attn_qkv"
            key = f"gpt_neox.layers.{parts[1]}.{_LAYER[parts[2]]}.{kind}"
            return key, Layout(qkv_heads=heads if fused else 0)
        return name, Layout()

    return rename
