"""Model families, each with its config reader, key map and assembly side by side, and the
loaders that dispatch on config.json's model_type.

  gpt2/        GPT-2                        -> CausalLM
  llama/       Llama, Mistral, Qwen2        -> CausalLM
  bert/        BERT (and the BertEncoder module the encoders share)
  roberta/     RoBERTa, XLM-RoBERTa         -> BertEncoder
  distilbert/  DistilBERT                   -> BertEncoder
  mpnet/       MPNet                        -> MPNetEncoder (a BertEncoder with a shared
               relative position bias)

Shared: checkpoint.py (files and headers), keymap.py (declarative key maps), fields.py
(config values), loading.py (meta-device build, then each tensor read once).
"""

from .causal_lm import CAUSAL_LM_FAMILIES, load_causal_lm
from .encoder import ENCODER_FAMILIES, load_encoder_model

__all__ = ["CAUSAL_LM_FAMILIES", "ENCODER_FAMILIES", "load_causal_lm", "load_encoder_model"]
