"""`multihead.load(source)`: whatever model `source` names, as the family it is.

The source is resolved and checked first (`models.check.check_model`: a directory, a .gguf
file, a Hub id in the local cache, the packaged default; every file it needs readable, with the
messages the command line prints); the checkpoint then says the family: a GGUF file
or a config.json model_type gpt2/llama/mistral/qwen2 is a causal LM (`load_causal_lm`), a
BERT-family model_type an encoder with its tokenizer (`load_encoder`). Any other model_type goes
to the bridge (`multihead.bridge.load_bridged`: transformers builds the model, multihead's
attention runs inside it), which refuses architectures it cannot route by name: native first,
bridge second, in this one resolver. So does a GGUF file whose general.architecture no native
family reads (`models.gguf.GGUF_ARCHITECTURES`): transformers reads it (its GGUF support) or it
is refused by name, before any tensor is read. The bridge (and transformers) is imported only
then."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from ..models.causal_lm import CAUSAL_LM_FAMILIES, load_causal_lm
from ..models.check import ModelFiles, check_model
from ..models.encoder import ENCODER_FAMILIES
from . import load_encoder


def load(
    source: str | os.PathLike[str] | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    quantized: bool = True,
) -> nn.Module:
    """A `CausalLM` (GGUF files; a model_type of `CAUSAL_LM_FAMILIES`) or a
    `SentenceEncoder` (bert, distilbert, mpnet, roberta, xlm-roberta), in eval mode, from
    `source` (None: the packaged all-MiniLM-L6-v2); for any other model_type a
    `multihead.bridge.BridgedModel` (see docs/bridge.md). `dtype`: None keeps the
    checkpoint's (float32 activations for quantised GGUF weights); `device`: where the weights go.
    `quantized` (GGUF files only; default True): a quantized file's matrices stay packed as
    stored (Q4_0/Q4_1/Q4_K as 4-bit groups, Q8_0 as int8, other types as the file's blocks,
    dequantised a tile at a time) and `.weight` dequantises on access; False dequantises the
    whole model at load, as 0.3 did."""
    # fast, and the same checks and messages as the command line's --model (any model_type:
    # what no native family reads goes to the bridge, which refuses by name what it cannot route)
    model = check_model(source, architecture=check_architecture)
    if model.gguf_architecture is not None:  # a GGUF no native family reads
        return load_through_bridge(model.path, model.path, model.gguf_architecture, dtype, device)
    if model.is_gguf:  # a native GGUF architecture
        return load_causal_lm(model.path, dtype=dtype, device=device, quantized=quantized)
    if model.model_type in CAUSAL_LM_FAMILIES:
        return load_causal_lm(model.path, dtype=dtype, device=device)
    if model.model_type in ENCODER_FAMILIES:
        return load_encoder(model.path, dtype=dtype, device=device)
    config_file = model.folder / "config.json"
    return load_through_bridge(model.path, config_file, model.model_type, dtype, device)


def check_architecture(model: ModelFiles) -> None:
    """`check_model`'s `architecture` hook for `multihead.load` (and the command line's GGUF
    files): checked as soon as config.json is read, before the files: a model_type no native
    family reads must be one the bridge can build (transformers is imported only then); so must
    a GGUF file's general.architecture no native family reads (its header only)."""
    if model.gguf_architecture is not None:
        _bridge(model.path, model.gguf_architecture).bridged_gguf_class(model.path)
        return
    if model.model_type in CAUSAL_LM_FAMILIES or model.model_type in ENCODER_FAMILIES:
        return
    _bridge(model.folder / "config.json", model.model_type).bridged_class(model.folder)


def _bridge(config_file: os.PathLike[str], model_type: object) -> Any:
    """multihead.bridge (imported here only: `import multihead` and native loads never import
    transformers); a ValueError naming the model_type when transformers is missing."""
    known = sorted([*CAUSAL_LM_FAMILIES, *ENCODER_FAMILIES])
    try:
        from .. import bridge
    except ImportError as e:  # transformers missing
        if str(config_file).endswith(".gguf"):
            from ..models.gguf import GGUF_ARCHITECTURES

            raise ValueError(
                f"{str(config_file)!r}: unsupported architecture {model_type!r} "
                f"(general.architecture); multihead loads GGUF architectures "
                f"{', '.join(map(repr, GGUF_ARCHITECTURES))} natively, and others through the "
                f"bridge, which needs transformers ({e})"
            ) from None
        raise ValueError(
            f"{str(config_file)!r}: unsupported architecture: model_type {model_type!r}; "
            f"multihead.load reads model_type {', '.join(map(repr, known))} natively, and "
            f"others through the bridge, which needs transformers ({e})"
        ) from None
    return bridge


def load_through_bridge(
    path: os.PathLike[str],
    config_file: os.PathLike[str],
    model_type: object,
    dtype: torch.dtype | None,
    device: torch.device | str | None,
) -> nn.Module:
    """A model_type with no native family, through the bridge."""
    return _bridge(config_file, model_type).load_bridged(path, dtype=dtype, device=device)
