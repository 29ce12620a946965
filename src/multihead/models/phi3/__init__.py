"""Phi-3 (Hugging Face Phi3ForCausalLM) as a multihead CausalLM: Llama's blocks and key map
over a view that unfuses qkv_proj and gate_up_proj; its config (longrope scaling, partial
rotary, the sliding window) read by the Llama family's reader; GGUF names in gguf.py."""

from ..decoder import finish_causal_lm, tied_head
from ..llama.config import llama_family_config
from ..llama.keymap import LLAMA_IGNORED, llama_key_map, llama_rename
from ..lm import CausalLM
from ..loading import Family
from .view import phi3_view

PHI3 = Family(
    read_config=llama_family_config,
    build=CausalLM,
    key_map=llama_key_map,
    num_layers=lambda config: config.num_layers,
    rename=llama_rename,
    ignored=LLAMA_IGNORED,
    tied=tied_head,
    finish=finish_causal_lm,
    view=phi3_view,
)

__all__ = ["PHI3", "phi3_view"]
