"""OLMo 2 (Hugging Face Olmo2ForCausalLM) as a multihead CausalLM: config reader, key map
(the shared decoder key map, models/decoder_keys.py), GGUF names, family."""

from ..decoder import finish_causal_lm, tied_head
from ..decoder_keys import decoder_key_map
from ..llama.keymap import LLAMA_IGNORED, llama_rename
from ..lm import CausalLM
from ..loading import Family
from .config import olmo2_config

OLMO2 = Family(
    read_config=olmo2_config,
    build=CausalLM,
    key_map=decoder_key_map,
    num_layers=lambda config: config.num_layers,
    rename=llama_rename,
    ignored=LLAMA_IGNORED,
    tied=tied_head,
    finish=finish_causal_lm,
)
MODEL_TYPES = ("olmo2",)

__all__ = ["MODEL_TYPES", "OLMO2", "olmo2_config"]
