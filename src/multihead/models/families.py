"""The decoder families by `model_type`: what `load_causal_lm` dispatches on for directories
and the GGUF loader for files (one table, imported by both)."""

from __future__ import annotations

from .gemma import GEMMA
from .gpt2 import GPT2
from .gpt_neox import GPT_NEOX
from .llama import LLAMA
from .loading import Family
from .olmo2 import OLMO2
from .phi3 import PHI3
from .qwen3 import QWEN3

CAUSAL_LM_FAMILIES: dict[str, Family] = {
    "gpt2": GPT2,
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "gpt_neox": GPT_NEOX,
    "phi3": PHI3,
    # RMSNorm + gated-MLP decoders whose differences are data (models/decoder_keys.py)
    "gemma": GEMMA,
    "gemma2": GEMMA,
    "gemma3_text": GEMMA,
    "qwen3": QWEN3,
    "olmo2": OLMO2,
}
