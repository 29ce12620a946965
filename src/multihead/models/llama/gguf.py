"""Llama, Mistral, Qwen2 and Phi-3 from GGUF (llama.cpp's names and metadata) -> the config.json
and Hugging Face keys that `llama_family_config` and `llama_key_map` read.

llama.cpp permutes the rows of q and k for Llama and Mistral (its rotary kernels pair
neighbouring values; Hugging Face pairs the two halves of a head) but not for Qwen2 or Phi-3.
Phi-3 keeps its fused attn_qkv and ffn_up (gate | up), as Hugging Face does. RoPE factors stored
as tensors (Llama 3.1's rope_freqs, Phi-3's rope_factors_long / _short) are read into the
config by gguf/load.py (`ROPE_TENSORS`)."""

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
_PHI3_LAYER = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
# GGUF rope.scaling.type -> Hugging Face rope_type (Phi-3's longrope: its factor tensors)
_ROPE_TYPES = {"none": "default", "linear": "linear", "longrope": "longrope"}
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def llama_gguf_config(meta: Metadata, tensor_names: set[str]) -> dict:
    arch = meta.arch
    heads = meta.get("attention.head_count")
    dim = meta.get("embedding_length")
    head_dim = meta.get("attention.key_length", dim // heads if heads else None)
    rotary = meta.get("rope.dimension_count", head_dim)
    if rotary != head_dim and arch != "phi3":
        raise ValueError(
            f"{meta.source}: {arch}.rope.dimension_count {rotary} != head size {head_dim} "
            f"(RoPE on part of each head is not supported for {arch})"
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
    if rotary != head_dim:
        config["partial_rotary_factor"] = rotary / head_dim
    kind = meta.get("rope.scaling.type", "none", kind=str)
    if kind not in _ROPE_TYPES:
        raise ValueError(
            f"{meta.source}: RoPE scaling {kind!r} ({arch}.rope.scaling.type) is not supported "
            f"from GGUF; supported: {', '.join(_ROPE_TYPES)}"
        )
    if kind == "longrope" and not set(ROPE_TENSORS[1:]) <= tensor_names:
        raise ValueError(
            f"{meta.source}: {arch}.rope.scaling.type 'longrope' without the tensors "
            "rope_factors_long.weight and rope_factors_short.weight"
        )
    if kind not in ("none", "longrope"):  # longrope: gguf/load.py reads its factor tensors
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
    if arch == "phi3":  # llama.cpp writes 0 for "no window"
        config["sliding_window"] = meta.get("attention.sliding_window", 0) or None
        config["original_max_position_embeddings"] = meta.get(
            "rope.scaling.original_context_length", config["max_position_embeddings"]
        )
    return config


def llama_gguf_names(meta: Metadata, config: dict) -> GGUFNames:
    permute = meta.arch in ("llama", "mistral")
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    layer = _LAYER | _PHI3_LAYER if meta.arch == "phi3" else _LAYER

    def rename(name: str) -> tuple[str, Layout] | None:
        if name in ROPE_TENSORS:  # not weights: read into the config
            return None
        stem, _, kind = name.rpartition(".")  # kind: weight or bias
        parts = stem.split(".")
        if len(parts) == 1 and parts[0] in _GLOBAL:
            return f"{_GLOBAL[parts[0]]}.{kind}", Layout()
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer:
            key = f"model.layers.{parts[1]}.{layer[parts[2]]}.{kind}"
            return key, Layout(heads=heads.get(parts[2], 0) if permute else 0)
        return name, Layout()  # not ours: the loader names it as unexpected

    return rename
