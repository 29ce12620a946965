"""`load_gguf_causal_lm(file.gguf)`: a GGUF decoder into a multihead CausalLM.

The file's metadata becomes the config.json its family reads (models/<family>/gguf.py), its
tensors are presented under Hugging Face keys (GGUFCheckpoint), and the usual loader builds the
model on the meta device and fills it tensor by tensor; the tokenizer comes from the metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ...modules.lm import CausalLM
from ..gpt2.gguf import gpt2_gguf_config, gpt2_gguf_names
from ..llama.gguf import llama_gguf_config, llama_gguf_names
from .checkpoint import GGUFCheckpoint, GGUFNames
from .metadata import Metadata
from .reader import GGUFFile
from .tokenizer import TokenizerParts, gguf_tokenizer

# general.architecture -> (metadata -> config.json, GGUF tensor names -> Hugging Face keys)
GGUF_ARCHITECTURES: dict[
    str, tuple[Callable[[Metadata, set[str]], dict], Callable[[Metadata, dict], GGUFNames]]
] = {
    "llama": (llama_gguf_config, llama_gguf_names),
    "mistral": (llama_gguf_config, llama_gguf_names),
    "qwen2": (llama_gguf_config, llama_gguf_names),
    "gpt2": (gpt2_gguf_config, gpt2_gguf_names),
}


def read_gguf(path: str | Path) -> tuple[GGUFFile, Metadata, dict]:
    """The file, its metadata and the config.json it amounts to (no tensor data is read)."""
    file = GGUFFile(path)
    meta = Metadata(file.metadata, repr(str(file.path)))
    arch = meta.arch
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"{meta.source}: unsupported architecture {arch!r} (general.architecture); multihead "
            f"loads GGUF architectures {', '.join(map(repr, GGUF_ARCHITECTURES))}"
        )
    config = GGUF_ARCHITECTURES[arch][0](meta, set(file.tensors))
    return file, meta, config


def load_gguf_causal_lm(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> tuple[CausalLM, TokenizerParts | None]:
    """The model in a GGUF file and the parts of its tokenizer (None when it has none).
    `dtype` None: float32 for quantised weights, else the stored float dtype."""
    from ..causal_lm import CAUSAL_LM_FAMILIES  # causal_lm imports this module
    from ..loading import load_model

    file, meta, config = read_gguf(path)
    tokenizer = gguf_tokenizer(meta)  # before the weights: a refused tokenizer costs nothing
    checkpoint = GGUFCheckpoint(file, GGUF_ARCHITECTURES[meta.arch][1](meta, config))
    family = CAUSAL_LM_FAMILIES[config["model_type"]]
    model = load_model(family, config, checkpoint, dtype=dtype, device=device)
    assert isinstance(model, CausalLM)
    return model, tokenizer
