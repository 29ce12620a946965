"""GPT-NeoX (Pythia; Hugging Face GPTNeoXForCausalLM) as a multihead CausalLM: config reader,
key map (with the view that unfuses query_key_value), GGUF names, family."""

from ..decoder import finish_causal_lm, tied_head
from ..lm import CausalLM
from ..loading import Family
from .config import gpt_neox_config
from .keymap import GPT_NEOX_IGNORED, gpt_neox_key_map, gpt_neox_rename, gpt_neox_view

GPT_NEOX = Family(
    read_config=gpt_neox_config,
    build=CausalLM,
    key_map=gpt_neox_key_map,
    num_layers=lambda config: config.num_layers,
    rename=gpt_neox_rename,
    ignored=GPT_NEOX_IGNORED,
    tied=tied_head,
    finish=finish_causal_lm,
    view=gpt_neox_view,
)

__all__ = ["GPT_NEOX", "gpt_neox_config", "gpt_neox_key_map"]
