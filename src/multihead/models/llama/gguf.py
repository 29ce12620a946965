"""Llama, Mistral and Qwen2 from GGUF (llama.cpp's names and metadata) -> the config.json and
Hugging Face keys that `llama_family_config` and `llama_key_map` read.

llama.cpp permutes the rows of q and k for Llama and Mistral (its rotary kernels pair
neighbouring values; Hugging Face pairs the two halves of a head) but not for Qwen2."""

from __future__ import annotations

from ..gguf.checkpoint import GGUFNames, Layout
from ..gguf.metadata import Metadata

_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# GGUF rope.scaling.type -> Hugging Face rope_type
_ROPE_TYPES = {"none": "default", "linear": "linear"}


def llama_gguf_config(meta: Metadata, tensor_names: set[str]) -> dict:
    arch = meta.arch
    heads = meta.get("attention.head_count")
    dim = meta.get("embedding_length")
    head_dim = meta.get("attention.key_length", dim // heads if heads else None)
    rotary = meta.get("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ValueError(
            f"{meta.source}: {arch}.rope.dimension_count {rotary} != head size {head_dim} "
            "(RoPE on part of each head is not supported)"
        )
    if "rope_freqs.weight" in tensor_names:
        raise ValueError(
            f"{meta.source}: per-dimension RoPE factors (tensor rope_freqs.weight, Llama 3.1 "
            "scaling) are not supported from GGUF"
        )
    vocab = meta.get("vocab_size", None) or meta.token_count()
    config: dict = {
        "model_type": arch,
        "hidden_size": dim,
        "intermediate_size": meta.get("feed_forward_length"),
        "num_hidden_layers": meta.get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": meta.get("attention.layer_norm_rms_epsilon", kind=float),
        "rope_theta": meta.get("rope.freq_base", 10000.0, kind=float),
        "max_position_embeddings": meta.get("context_length"),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "silu",
    }
    kind = meta.get("rope.scaling.type", "none", kind=str)
    if kind not in _ROPE_TYPES:
        raise ValueError(
            f"{meta.source}: RoPE scaling {kind!r} ({arch}.rope.scaling.type) is not supported "
            f"from GGUF; supported: {', '.join(_ROPE_TYPES)}"
        )
    if kind != "none":
        config["rope_scaling"] = {
            "rope_type": _ROPE_TYPES[kind],
            "factor": meta.get("rope.scaling.factor", kind=float),
        }
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    if arch == "qwen2":
        config["use_sliding_window"] = False
    if arch == "mistral":
        config["sliding_window"] = meta.get("attention.sliding_window", None)
    return config


def llama_gguf_names(meta: Metadata, config: dict) -> GGUFNames:
    permute = meta.arch in ("llama", "mistral")
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}

    def rename(name: str) -> tuple[str, Layout] | None:
        stem, _, kind = name.rpartition(".")  # kind: weight or bias
        parts = stem.split(".")
        if len(parts) == 1 and parts[0] in _GLOBAL:
            return f"{_GLOBAL[parts[0]]}.{kind}", Layout()
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER:
            key = f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{kind}"
            return key, Layout(heads=heads.get(parts[2], 0) if permute else 0)
        return name, Layout()  # not ours: the loader names it as unexpected

    return rename
