"""OLMo 2 from GGUF (llama.cpp's names and metadata) -> the config.json and Hugging Face keys
`olmo2_config` and the shared decoder key map read."""

from __future__ import annotations

from ..decoder_gguf import base_config, decoder_names, rope_fields
from ..gguf.checkpoint import GGUFNames
from ..gguf.metadata import Metadata


def olmo2_gguf_config(meta: Metadata, tensor_names: set[str]) -> dict:
    config = base_config(meta, tensor_names, "olmo2")
    config.update(rope_fields(meta))
    config["hidden_act"] = "silu"
    config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    if meta.get("attention.sliding_window", None) is not None:  # OLMo 3 writes one
        raise ValueError(
            f"{meta.source}: {meta.arch}.attention.sliding_window is set (OLMo 3's windows); "
            "multihead reads OLMo 2, which has none"
        )
    return config


def olmo2_gguf_names(meta: Metadata, config: dict) -> GGUFNames:
    return decoder_names({})  # (its norms: post_attention_norm, post_ffw_norm, q/k norms)
