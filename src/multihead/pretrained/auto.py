"""`multihead.load(source)`: whatever model `source` names, as the family it is.

The source is resolved and checked first (`models.check.check_model`: a directory, a .gguf
file, a Hub id in the local cache, the packaged default; every file it needs readable, with the
messages the command line prints); the checkpoint then says the family: a GGUF file
or a config.json model_type gpt2/llama/mistral/qwen2 is a causal LM (`load_causal_lm`), a
BERT-family model_type an encoder with its tokenizer (`load_encoder`)."""

from __future__ import annotations

import os

import torch
from torch import nn

from ..models.causal_lm import CAUSAL_LM_FAMILIES, load_causal_lm
from ..models.check import check_model
from ..models.encoder import ENCODER_FAMILIES
from . import load_encoder


def load(
    source: str | os.PathLike[str] | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> nn.Module:
    """A `CausalLM` (GGUF files; model_type gpt2, llama, mistral, qwen2) or a
    `SentenceEncoder` (bert, distilbert, mpnet, roberta, xlm-roberta), in eval mode, from
    `source` (None: the packaged all-MiniLM-L6-v2). `dtype`: None keeps the checkpoint's
    (float32 for quantised GGUF weights); `device`: where the weights go."""
    # fast, and the same checks and messages as the command line's --model
    model = check_model(source, model_types=[*CAUSAL_LM_FAMILIES, *ENCODER_FAMILIES])
    if model.is_gguf or model.model_type in CAUSAL_LM_FAMILIES:
        return load_causal_lm(model.path, dtype=dtype, device=device)
    return load_encoder(model.path, dtype=dtype, device=device)
