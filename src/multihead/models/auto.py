"""`multihead.load(source)`: whatever model `source` names, as the family it is.

The source is resolved once (`models.source.resolve_model`: a directory, a .gguf file, a Hub
id in the local cache, the packaged default); the checkpoint then says the family: a GGUF file
or a config.json model_type gpt2/llama/mistral/qwen2 is a causal LM (`load_causal_lm`), a
BERT-family model_type an encoder with its tokenizer (`load_encoder`)."""

from __future__ import annotations

import os

import torch
from torch import nn

from ..model_layout import transformer_folder
from .causal_lm import CAUSAL_LM_FAMILIES, load_causal_lm
from .checkpoint import read_json
from .encoder import ENCODER_FAMILIES
from .source import resolve_model


def load(
    source: str | os.PathLike[str] | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    quantized: bool = True,
) -> nn.Module:
    """A `CausalLM` (GGUF files; model_type gpt2, llama, mistral, qwen2) or a
    `SentenceEncoder` (bert, distilbert, mpnet, roberta, xlm-roberta), in eval mode, from
    `source` (None: the packaged all-MiniLM-L6-v2). `dtype`: None keeps the checkpoint's
    (float32 activations for quantised GGUF weights); `device`: where the weights go.
    `quantized` (GGUF files only; default True): a quantized file's matrices stay packed as
    stored (Q4_0/Q4_1/Q4_K as 4-bit groups, Q8_0 as int8, other types as the file's blocks,
    dequantised a tile at a time) and `.weight` dequantises on access; False dequantises the
    whole model at load, as 0.3 did."""
    resolved = resolve_model(source)
    if resolved.is_gguf:
        return load_causal_lm(resolved.path, dtype=dtype, device=device, quantized=quantized)
    config_file = transformer_folder(resolved.path) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"model directory {str(resolved.path)!r} lacks config.json")
    model_type = read_json(config_file).get("model_type")
    if model_type in CAUSAL_LM_FAMILIES:
        return load_causal_lm(resolved.path, dtype=dtype, device=device)
    if model_type in ENCODER_FAMILIES:
        from ..pretrained import load_encoder  # pretrained builds on models

        return load_encoder(resolved.path, dtype=dtype, device=device)
    known = sorted([*CAUSAL_LM_FAMILIES, *ENCODER_FAMILIES])
    raise ValueError(
        f"{str(config_file)!r}: unsupported architecture: model_type {model_type!r}; "
        f"multihead.load reads model_type {', '.join(map(repr, known))}"
    )
