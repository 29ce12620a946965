"""Qwen3 from GGUF (llama.cpp's names and metadata) -> the config.json and Hugging Face keys
`qwen3_config` and the shared decoder key map read."""

from __future__ import annotations

from ..decoder_gguf import base_config, decoder_names, rope_fields
from ..gguf.checkpoint import GGUFNames
from ..gguf.metadata import Metadata


def qwen3_gguf_config(meta: Metadata, tensor_names: set[str]) -> dict:
    config = base_config(meta, tensor_names, "qwen3")
    config.update(rope_fields(meta))
    config["hidden_act"] = "silu"
    config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    return config


def qwen3_gguf_names(meta: Metadata, config: dict) -> GGUFNames:
    # the norm before the MLP sits where Llama's does: Hugging Face's post_attention_layernorm
    return decoder_names({"ffn_norm": "post_attention_layernorm"})
