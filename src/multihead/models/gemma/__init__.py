"""Gemma (1), Gemma 2 and Gemma 3 text (Hugging Face GemmaForCausalLM, Gemma2ForCausalLM,
Gemma3ForCausalLM) as a multihead CausalLM: config reader, key map, GGUF names, family."""

from ..decoder import finish_causal_lm, tied_head
from ..lm import CausalLM
from ..loading import Family
from .config import gemma_config
from .keymap import GEMMA_IGNORED, gemma_key_map, gemma_rename

GEMMA = Family(
    read_config=gemma_config,
    build=CausalLM,
    key_map=gemma_key_map,
    num_layers=lambda config: config.num_layers,
    rename=gemma_rename,
    ignored=GEMMA_IGNORED,
    tied=tied_head,
    finish=finish_causal_lm,
)
MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")

__all__ = ["GEMMA", "MODEL_TYPES", "gemma_config", "gemma_key_map"]
