"""GPT-2 (Hugging Face GPT2LMHeadModel) as a multihead CausalLM: config, key map, family."""

from ..decoder import finish_causal_lm, tied_head
from ..lm import CausalLM
from ..loading import Family
from .config import gpt2_config
from .keymap import GPT2_IGNORED, GPT2_KEY_MAP, gpt2_key_map, gpt2_rename

GPT2 = Family(
    read_config=gpt2_config,
    build=CausalLM,
    key_map=gpt2_key_map,
    num_layers=lambda config: config.num_layers,
    rename=gpt2_rename,
    ignored=GPT2_IGNORED,
    tied=tied_head,
    finish=finish_causal_lm,
)

__all__ = ["GPT2", "GPT2_KEY_MAP", "gpt2_config", "gpt2_key_map"]
