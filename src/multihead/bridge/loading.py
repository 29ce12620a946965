"""A checkpoint with no native family, built by transformers and wrapped (`wrap`): a model
directory or a cached Hub id, as `multihead.models.source.resolve_model` names them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .discover import BridgeError, uses_registry
from .model import BridgedModel
from .wrapping import wrap

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def model_class(config: Any) -> Any:
    """transformers' causal-LM class for `config`, else its seq2seq-LM class; BridgeError
    naming the model_type when it has neither."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    for auto in (AutoModelForCausalLM, AutoModelForSeq2SeqLM):
        mapping = auto._model_mapping
        if type(config) in mapping:
            return mapping[type(config)]
    raise BridgeError(
        f"model_type {getattr(config, 'model_type', None)!r}: transformers has no causal-LM or "
        "seq2seq-LM class for it, so the bridge cannot build it"
    )


def bridged_class(folder: str | os.PathLike[str]) -> Any:
    """The transformers class the bridge would build for the model directory `folder`, from its
    config.json alone (no weights read); BridgeError naming the architecture when transformers
    does not know it or its attention does not go through the registry."""
    from transformers import AutoConfig

    folder = Path(folder)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, KeyError) as e:  # a model_type transformers does not know
        raise BridgeError(
            f"{str(folder / 'config.json')!r}: unsupported architecture: it is neither a "
            f"native multihead family nor a model transformers can build ({e})"
        ) from None
    cls = model_class(config)
    if not uses_registry(cls):
        raise BridgeError(
            f"{cls.__name__} (model_type {config.model_type!r}) does not use transformers' "
            "attention registry (AttentionInterface), so multihead's attention cannot be put "
            "inside it"
        )
    return cls


def load_bridged(
    source: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> BridgedModel:
    """The model in `source` (a directory in the Hugging Face layout or a cached Hub id) built by
    transformers, routed through multihead's attention, in eval mode, with its tokenizer when
    the directory has one. The architecture is checked before its weights are read."""
    from transformers import AutoTokenizer

    from ..models.source import resolve_model

    resolved = resolve_model(source)
    if resolved.is_gguf:
        raise BridgeError(
            f"{str(resolved.path)!r}: the bridge reads model directories; this GGUF file's "
            "architecture has no native multihead family"
        )
    folder = Path(resolved.path)
    cls = bridged_class(folder)
    kwargs: dict[str, Any] = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = cls.from_pretrained(folder, **kwargs)
    if device is not None:
        model = model.to(device)
    tokenizer = None
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return wrap(model.eval(), tokenizer).eval()
