"""The decoder families by `model_type`: what `load_causal_lm` dispatches on for directories
and the GGUF loader for files (one table, imported by both)."""

from __future__ import annotations

from .gpt2 import GPT2
from .gpt_neox import GPT_NEOX
from .llama import LLAMA
from .loading import Family
from .phi3 import PHI3

CAUSAL_LM_FAMILIES: dict[str, Family] = {
    "gpt2": GPT2,
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "gpt_neox": GPT_NEOX,
    "phi3": PHI3,
}
