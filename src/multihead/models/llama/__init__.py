"""Llama, Mistral and Qwen2 (Hugging Face *ForCausalLM) as a multihead CausalLM: config
reader, key map, family."""

from ..decoder import finish_causal_lm, tied_head
from ..lm import CausalLM
from ..loading import Family
from ..rope_config import rope_settings
from .config import llama_family_config
from .keymap import LLAMA_IGNORED, llama_key_map, llama_rename

LLAMA = Family(
    read_config=llama_family_config,
    build=CausalLM,
    key_map=llama_key_map,
    num_layers=lambda config: config.num_layers,
    rename=llama_rename,
    ignored=LLAMA_IGNORED,
    tied=tied_head,
    finish=finish_causal_lm,
)
MODEL_TYPES = ("llama", "mistral", "qwen2")

__all__ = ["LLAMA", "MODEL_TYPES", "llama_family_config", "llama_key_map", "rope_settings"]
