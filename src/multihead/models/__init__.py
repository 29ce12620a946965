"""Model families, each with its config reader, key map and assembly side by side, and the
loaders that dispatch on config.json's model_type.

  gpt2/        GPT-2                        -> CausalLM
  llama/       Llama, Mistral, Qwen2        -> CausalLM
  bert/        BERT (and the BertEncoder module the encoders share)
  roberta/     RoBERTa, XLM-RoBERTa         -> BertEncoder
  distilbert/  DistilBERT                   -> BertEncoder
  mpnet/       MPNet                        -> MPNetEncoder (a BertEncoder with a shared
               relative position bias)
  electra/     ELECTRA                      -> BertEncoder (+ embeddings_project)
  modernbert/  ModernBERT                   -> ModernBertEncoder (pre-norm GeGLU blocks, RoPE,
               local / global layers)

  gguf/        GGUF files: header, dequantisation, tokenizer (each family's GGUF names and
               metadata in its folder: llama/gguf.py, gpt2/gguf.py)

Shared: source.py (what a user names -> files), check.py (`check_model`: a model's files checked
before loading, torch-free; `multihead.load` and the CLI's --model run it), checkpoint.py
(files and headers), keymap.py (declarative key maps), fields.py
(config values), loading.py (meta-device build, then each tensor read once).
"""

import importlib
from typing import TYPE_CHECKING, Any

# imported on first use, so that `models.source` (name resolution, no torch) stays light
_LAZY = {
    "ModelCheckError": "check",
    "check_model": "check",
    "CAUSAL_LM_FAMILIES": "causal_lm",
    "load_causal_lm": "causal_lm",
    "ENCODER_FAMILIES": "encoder",
    "load_encoder_model": "encoder",
}

if TYPE_CHECKING:
    from .causal_lm import CAUSAL_LM_FAMILIES, load_causal_lm
    from .check import ModelCheckError, check_model
    from .encoder import ENCODER_FAMILIES, load_encoder_model


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CAUSAL_LM_FAMILIES",
    "ENCODER_FAMILIES",
    "ModelCheckError",
    "check_model",
    "load_causal_lm",
    "load_encoder_model",
]
