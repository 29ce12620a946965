"""A checkpoint with no native family, built by transformers and wrapped (`wrap`): a model
directory or a cached Hub id, as `multihead.models.source.resolve_model` names them, or a GGUF
file whose architecture transformers reads (its GGUF support: `gguf_file=`; the weights
dequantised, the tokenizer from the file's metadata)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..models.gguf import GGUFFile
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
    return _checked_class(config, "")


def _checked_class(config: Any, where: str) -> Any:
    cls = model_class(config)
    if not uses_registry(cls):
        raise BridgeError(
            f"{where}{cls.__name__} (model_type {config.model_type!r}) does not use "
            "transformers' attention registry (AttentionInterface), so multihead's attention "
            "cannot be put inside it"
        )
    return cls


def bridged_gguf_class(path: str | os.PathLike[str]) -> Any:
    """The transformers class the bridge would build for the GGUF file `path`, from its
    metadata alone (transformers reads the header; no tensor data); BridgeError naming the
    general.architecture when transformers cannot read it or its attention does not go through
    the registry."""
    from transformers import AutoConfig

    path = Path(path)
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    except (ValueError, KeyError, OSError) as e:  # an architecture transformers cannot read
        arch = _gguf_architecture(path)
        raise BridgeError(
            f"{str(path)!r}: unsupported architecture {arch!r} (general.architecture): it is "
            "neither a native multihead GGUF family nor one transformers' GGUF support reads "
            f"({' '.join(str(e).split())[:200]})"
        ) from None
    return _checked_class(config, f"{str(path)!r}: ")


def _gguf_architecture(path: Path) -> object:
    return GGUFFile(path).metadata.get("general.architecture")


def load_bridged(
    source: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> BridgedModel:
    """The model in `source` (a directory in the Hugging Face layout, a cached Hub id, or a GGUF
    file transformers reads) built by transformers, routed through multihead's attention, in
    eval mode, with its tokenizer when the directory (or the GGUF's metadata) has one. The
    architecture is checked before its weights are read."""
    from transformers import AutoTokenizer

    from ..models.source import resolve_model

    resolved = resolve_model(source)
    kwargs: dict[str, Any] = {"local_files_only": True}
    if resolved.is_gguf:
        folder = Path(resolved.path).parent
        cls = bridged_gguf_class(resolved.path)
        kwargs["gguf_file"] = Path(resolved.path).name
        has_tokenizer = "tokenizer.ggml.model" in GGUFFile(resolved.path).metadata
    else:
        folder = Path(resolved.path)
        cls = bridged_class(folder)
        has_tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs) if has_tokenizer else None
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = cls.from_pretrained(folder, **kwargs)
    if device is not None:
        model = model.to(device)
    return wrap(model.eval(), tokenizer).eval()
