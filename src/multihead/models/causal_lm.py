"""`load_causal_lm(dir)`: a decoder checkpoint into a multihead CausalLM, by model_type."""

from __future__ import annotations

from pathlib import Path

import torch

from .checkpoint import open_checkpoint, read_json
from .families import CAUSAL_LM_FAMILIES
from .fields import unsupported_architecture
from .lm import CausalLM
from .loading import load_model
from .source import resolve_model
from .text import ModelTokenizer

__all__ = ["CAUSAL_LM_FAMILIES", "load_causal_lm"]


def load_causal_lm(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    quantized: bool = True,
) -> CausalLM:
    """A decoder, in eval mode, from what `path` names (`multihead.models.source`): a
    directory in the Hugging Face layout (config.json and model.safetensors, its shard index,
    or pytorch_model.bin), a .gguf file, or a Hub id in the local Hugging Face cache.

    model_type (GGUF: general.architecture) gpt2, llama, mistral or qwen2. `dtype`: None keeps
    the checkpoint's (bfloat16 weights stay bfloat16; activations of quantised GGUF weights are
    float32); `quantized` (GGUF files; default True): quantized matrices stay packed as the file
    stores them, multiplied as stored (`multihead.modules.quantized`, about 1/7 of the float32
    memory for 4-bit files); False dequantises them, tensor by tensor, to `dtype`; `device`:
    where the weights are read to (default CPU). Every
    config field that changes the computation is implemented or refused by name. The model
    carries its tokenizer as `model.tokenizer` (the directory's tokenizer.json, or the one a
    GGUF file's metadata describes; None when there is none).
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    source = resolve_model(path)
    if source.is_gguf:
        from .gguf import load_gguf_causal_lm

        return load_gguf_causal_lm(source.path, dtype=dtype, device=device, quantized=quantized)
    model_dir = source.path
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} lacks config.json")
    config = read_json(model_dir / "config.json")
    family = CAUSAL_LM_FAMILIES.get(config.get("model_type"))  # type: ignore[arg-type]
    if family is None:
        raise unsupported_architecture(config, "load_causal_lm", list(CAUSAL_LM_FAMILIES))
    model = load_model(family, config, open_checkpoint(model_dir), dtype=dtype, device=device)
    assert isinstance(model, CausalLM)
    model.tokenizer = tokenizer_in(model_dir)
    return model


def tokenizer_in(model_dir: Path) -> ModelTokenizer | None:
    """The directory's tokenizer (see ModelTokenizer.from_dir); None without tokenizer.json."""
    if not (model_dir / "tokenizer.json").is_file():
        return None
    return ModelTokenizer.from_dir(model_dir)
