"""Qwen3 (Hugging Face Qwen3ForCausalLM) as a multihead CausalLM: config reader, key map
(the shared decoder key map, models/decoder_keys.py), GGUF names, family."""

from ..decoder import finish_causal_lm, tied_head
from ..decoder_keys import decoder_key_map
from ..llama.keymap import LLAMA_IGNORED, llama_rename
from ..lm import CausalLM
from ..loading import Family
from .config import qwen3_config

QWEN3 = Family(
    read_config=qwen3_config,
    build=CausalLM,
    key_map=decoder_key_map,
    num_layers=lambda config: config.num_layers,
    rename=llama_rename,
    ignored=LLAMA_IGNORED,
    tied=tied_head,
    finish=finish_causal_lm,
)
MODEL_TYPES = ("qwen3",)

__all__ = ["MODEL_TYPES", "QWEN3", "qwen3_config"]
