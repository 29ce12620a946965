"""GGUF files (llama.cpp, ollama, LM Studio): header reader, dequantisation, the checkpoint
that presents a file's tensors under Hugging Face keys, and the tokenizer its metadata holds.
Each family's GGUF names and metadata live in its own folder (llama/gguf.py, gpt2/gguf.py)."""

from .load import GGUF_ARCHITECTURES, load_gguf_causal_lm, read_gguf
from .reader import GGUFError, GGUFFile
from .tokenizer import TokenizerParts, check_gguf_tokenizer, gguf_tokenizer

__all__ = [
    "GGUF_ARCHITECTURES",
    "GGUFError",
    "GGUFFile",
    "TokenizerParts",
    "check_gguf_tokenizer",
    "gguf_tokenizer",
    "load_gguf_causal_lm",
    "read_gguf",
]
