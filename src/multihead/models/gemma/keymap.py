"""Our CausalLM parameters <- Gemma / Gemma 2 / Gemma 3 text keys: the shared decoder key map
(models/decoder_keys.py) reads where this config's norms sit."""

from __future__ import annotations

from ..decoder_keys import decoder_key_map as gemma_key_map
from ..llama.keymap import LLAMA_IGNORED as GEMMA_IGNORED
from ..llama.keymap import llama_rename as gemma_rename

__all__ = ["GEMMA_IGNORED", "gemma_key_map", "gemma_rename"]
