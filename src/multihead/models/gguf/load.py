"""`load_gguf_causal_lm(file.gguf)`: a GGUF decoder into a multihead CausalLM.

The file's metadata becomes the config.json its family reads (models/<family>/gguf.py), its
tensors are presented under Hugging Face keys (GGUFCheckpoint), and the usual loader builds the
model on the meta device and fills it tensor by tensor; the tokenizer comes from the metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..decoder_gguf import check_tensor_shapes
from ..families import CAUSAL_LM_FAMILIES
from ..gemma.gguf import gemma_gguf_config, gemma_gguf_names
from ..gpt2.gguf import gpt2_gguf_config, gpt2_gguf_names
from ..gpt_neox.gguf import gpt_neox_gguf_config, gpt_neox_gguf_names
from ..llama.gguf import ROPE_TENSORS, llama_gguf_config, llama_gguf_names
from ..lm import CausalLM
from ..olmo2.gguf import olmo2_gguf_config, olmo2_gguf_names
from ..qwen3.gguf import qwen3_gguf_config, qwen3_gguf_names
from .checkpoint import GGUFCheckpoint, GGUFNames, Layout
from .metadata import Metadata
from .quantized import packer
from .reader import GGUFFile
from .tokenizer import TokenizerParts, gguf_tokenizer

if TYPE_CHECKING:
    from ..text import ModelTokenizer

_TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")

# general.architecture -> (metadata -> config.json, GGUF tensor names -> Hugging Face keys)
GGUF_ARCHITECTURES: dict[
    str, tuple[Callable[[Metadata, set[str]], dict], Callable[[Metadata, dict], GGUFNames]]
] = {
    "llama": (llama_gguf_config, llama_gguf_names),
    "mistral": (llama_gguf_config, llama_gguf_names),
    "qwen2": (llama_gguf_config, llama_gguf_names),
    "phi3": (llama_gguf_config, llama_gguf_names),
    "gpt2": (gpt2_gguf_config, gpt2_gguf_names),
    "gptneox": (gpt_neox_gguf_config, gpt_neox_gguf_names),
    "gemma": (gemma_gguf_config, gemma_gguf_names),
    "gemma2": (gemma_gguf_config, gemma_gguf_names),
    "gemma3": (gemma_gguf_config, gemma_gguf_names),
    "qwen3": (qwen3_gguf_config, qwen3_gguf_names),
    "olmo2": (olmo2_gguf_config, olmo2_gguf_names),
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
    _rope_factors(file, meta, config)
    check_tensor_shapes(meta, config, {name: t.shape for name, t in file.tensors.items()})
    embedding = file.tensors.get("token_embd.weight")
    if config.get("vocab_size") is None and embedding is not None:  # no vocab_size, no tokens
        config["vocab_size"] = embedding.shape[0]
    return file, meta, config


def _rope_factors(file: GGUFFile, meta: Metadata, config: dict) -> None:
    """RoPE factors llama.cpp stores as tensors, into the config: Llama 3.1's rope_freqs (what
    each frequency is divided by, computed by the converter from the llama3 rope_scaling) and
    Phi-3's rope_factors_long / _short (longrope, with rope.scaling.attn_factor)."""
    present = [name for name in ROPE_TENSORS if name in file.tensors]
    if not present:
        return
    reader = GGUFCheckpoint(file, lambda name: (name, Layout()) if name in present else None)
    values = {name: [float(v) for v in reader.read(name).reshape(-1)] for name in present}
    if "rope_freqs.weight" in values:
        if "rope_scaling" in config:
            raise ValueError(
                f"{meta.source}: both rope_freqs.weight and {meta.arch}.rope.scaling.type; "
                "a file carries one RoPE scaling"
            )
        config["rope_scaling"] = {"rope_type": "default", "rope_freqs": values["rope_freqs.weight"]}
        return
    if len(values) != 2:
        raise ValueError(
            f"{meta.source}: {present[0]} without its pair (longrope needs both "
            "rope_factors_long.weight and rope_factors_short.weight)"
        )
    config["rope_scaling"] = {
        "rope_type": "longrope",
        "long_factor": values["rope_factors_long.weight"],
        "short_factor": values["rope_factors_short.weight"],
        "attention_factor": meta.get("rope.scaling.attn_factor", None, kind=float),
    }


def load_gguf_causal_lm(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    tokenizer: bool = True,
    quantized: bool = True,
) -> CausalLM:
    """The model in a GGUF file, carrying the tokenizer its metadata describes as
    `model.tokenizer` (a `ModelTokenizer`; None when the file has none, or with
    `tokenizer=False`: token ids only, the tokenizer metadata unread). `dtype` None: float32
    for quantised weights, else the stored float dtype. `quantized` (default True): quantized
    matrices stay packed as stored (`multihead.modules.quantized`; activations in `dtype`);
    False dequantises every tensor at load (0.3's model, ~7x the memory for 4-bit files)."""
    from ..loading import load_model

    file, meta, config = read_gguf(path)
    # before the weights: a refused tokenizer costs nothing
    parts = gguf_tokenizer(meta) if tokenizer else None
    model_tokenizer = None if parts is None else _model_tokenizer(parts)
    del parts
    for key in _TOKENIZER_ARRAYS:  # ~100,000 Python strings, held by the tokenizer now
        meta.values.pop(key, None)
    checkpoint = GGUFCheckpoint(file, GGUF_ARCHITECTURES[str(meta.arch)][1](meta, config))
    family = CAUSAL_LM_FAMILIES[config["model_type"]]
    try:
        pack = packer(checkpoint) if quantized else None
        model = load_model(family, config, checkpoint, dtype=dtype, device=device, pack=pack)
    except ValueError as e:  # metadata and tensors disagree: say which file
        message = str(e)
        raise ValueError(
            message if meta.source in message else f"{meta.source}: {message}"
        ) from None
    assert isinstance(model, CausalLM)
    if quantized:
        # Packed matrices are frozen (no parameter to train); the norms and biases left as
        # parameters are frozen with them, so an inference forward (run_with_cache without
        # no_grad) records no autograd graph: on a Llama-3-8B-shaped Q4_0 file that graph held
        # ~2.5 GiB at its peak. Gradients with respect to activations still flow (attribution
        # patching); `model.requires_grad_(True)` makes the remaining parameters trainable.
        model.requires_grad_(False)
    model.tokenizer = model_tokenizer
    return model


def _model_tokenizer(parts: TokenizerParts) -> ModelTokenizer:
    from ..text import ModelTokenizer

    return ModelTokenizer(
        parts.tokenizer,
        bos_id=parts.bos_id,
        eos_id=parts.eos_id,
        pad_id=parts.pad_id,
        add_bos=parts.add_bos and parts.bos_id is not None,
        name=parts.name,
    )
