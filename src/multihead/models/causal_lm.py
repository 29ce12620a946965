"""`load_causal_lm(dir)`: a decoder checkpoint into a multihead CausalLM, by model_type."""

from __future__ import annotations

from pathlib import Path

import torch

from ..modules.lm import CausalLM
from .checkpoint import open_checkpoint, read_json
from .fields import unsupported_architecture
from .gpt2 import GPT2
from .llama import LLAMA
from .loading import Family, load_model

CAUSAL_LM_FAMILIES: dict[str, Family] = {
    "gpt2": GPT2,
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
}


def load_causal_lm(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> CausalLM:
    """A decoder checkpoint directory in the Hugging Face layout (config.json and
    model.safetensors, its shard index, or pytorch_model.bin), in eval mode.

    model_type gpt2, llama, mistral or qwen2. `dtype`: None keeps the checkpoint's (bfloat16
    weights stay bfloat16); `device`: where the weights are read to (default CPU). Every config
    field that changes the computation is implemented or refused by name.
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
    model_dir = Path(path).expanduser()
    if model_dir.is_file():
        raise ValueError(f"{str(model_dir)!r} is a file, not a model directory or .gguf file")
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} lacks config.json")
    config = read_json(model_dir / "config.json")
    family = CAUSAL_LM_FAMILIES.get(config.get("model_type"))  # type: ignore[arg-type]
    if family is None:
        raise unsupported_architecture(config, "load_causal_lm", list(CAUSAL_LM_FAMILIES))
    model = load_model(family, config, open_checkpoint(model_dir), dtype=dtype, device=device)
    assert isinstance(model, CausalLM)
    return model
