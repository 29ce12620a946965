"""Gemma, Gemma 2 and Gemma 3 from GGUF (llama.cpp's names and metadata) -> the config.json and
Hugging Face keys `gemma_config` and `gemma_key_map` read.

As llama.cpp reads these files: the converter stores every norm weight as 1 + w (read back as
w); it writes no query_pre_attn_scalar, so the scale is 1/sqrt(head_dim) (1/sqrt(hidden /
heads) for the 27B models, by layer count); Gemma 2 windows every other layer and Gemma 3 five
layers of six unless `{arch}.attention.sliding_window_pattern` says otherwise; Gemma 3's
windowed layers rotate with `rope.freq_base_swa` (default 10000)."""

from __future__ import annotations

from ..decoder_gguf import base_config, decoder_names, rope_fields
from ..gguf.checkpoint import GGUFNames
from ..gguf.metadata import Metadata

# general.architecture -> (model_type, default window pattern, block count of the 27B model)
_ARCHS = {
    "gemma": ("gemma", None, None),
    "gemma2": ("gemma2", 2, 46),
    "gemma3": ("gemma3_text", 6, 62),
}


def _layer_types(meta: Metadata, layers: int, pattern: int) -> list[str]:
    stored = meta.values.get(f"{meta.arch}.attention.sliding_window_pattern")
    if isinstance(stored, list):
        if len(stored) != layers or not all(isinstance(v, bool) for v in stored):
            raise ValueError(
                f"{meta.source}: {meta.arch}.attention.sliding_window_pattern must list "
                f"{layers} booleans (one per block), got {stored!r}"
            )
        return ["sliding_attention" if v else "full_attention" for v in stored]
    if stored is not None:
        pattern = meta.get("attention.sliding_window_pattern")
    # llama.cpp's set_swa_pattern: layer i is windowed when i % pattern < pattern - 1
    return [
        "sliding_attention" if i % pattern < pattern - 1 else "full_attention"
        for i in range(layers)
    ]


def gemma_gguf_config(meta: Metadata, tensor_names: set[str]) -> dict:
    model_type, pattern, layers_27b = _ARCHS[str(meta.arch)]
    config = base_config(meta, tensor_names, model_type)
    config["hidden_activation" if pattern else "hidden_act"] = "gelu_pytorch_tanh"
    config.update(rope_fields(meta))
    if pattern is None:
        return config
    layers, dim, heads = (
        config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")
    )
    config["query_pre_attn_scalar"] = dim // heads if layers == layers_27b else config["head_dim"]
    config["final_logit_softcapping"] = meta.get("final_logit_softcapping", None, kind=float)
    window = meta.get("attention.sliding_window", None)
    if model_type == "gemma2":
        config["attn_logit_softcapping"] = meta.get("attn_logit_softcapping", None, kind=float)
        config["sliding_window"] = 4096 if window is None else window
        config["layer_types"] = _layer_types(meta, layers, pattern)
        return config
    if window:
        config["sliding_window"] = window
        config["layer_types"] = _layer_types(meta, layers, pattern)
    else:
        config["layer_types"] = ["full_attention"] * layers
    full = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    if "rope_scaling" in config:
        full.update(config.pop("rope_scaling"))
    local = meta.get("rope.freq_base_swa", 10000.0, kind=float)
    config["rope_parameters"] = {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": local},
    }
    return config


def gemma_gguf_names(meta: Metadata, config: dict) -> GGUFNames:
    # Gemma 1: the norm before the MLP is Hugging Face's post_attention_layernorm (Llama's place)
    own = {"ffn_norm": "post_attention_layernorm"} if meta.arch == "gemma" else {}
    return decoder_names(own, norm_shift=-1.0)
