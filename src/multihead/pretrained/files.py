"""Find an encoder's model directory in the Hugging Face layout, offline.

The name is resolved by `multihead.models.source.resolve_model` (a directory, a packaged model
name, a Hub id in the local cache); this checks that the directory holds what an encoder needs:
config.json, weights (model.safetensors, its shard index or pytorch_model.bin) and
tokenizer.json. In a sentence-transformers directory those files are the Transformer's, in the
folder modules.json names (see `model_layout`).
"""

from __future__ import annotations

from pathlib import Path

from ..model_layout import transformer_folder
from ..models.checkpoint import WEIGHT_FILES
from ..models.source import DEFAULT_MODEL, PACKAGED_MODELS, resolve_model

__all__ = ["DEFAULT_MODEL", "PACKAGED_MODELS", "resolve_model_dir"]


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """The model directory for a packaged model name, a cached Hub id or a path; clear errors
    otherwise (a .gguf file is refused: GGUF files hold decoders)."""
    if not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"name_or_path must be a str or Path, got {type(name_or_path).__name__}")
    source = resolve_model(name_or_path)
    path = source.path
    if source.is_gguf:
        raise NotADirectoryError(
            f"model path {str(path)!r} is a file (GGUF), not a directory; encoders load from a "
            "model directory (GGUF files hold decoders: load_causal_lm or multihead.load)"
        )
    files = transformer_folder(path)
    missing = [n for n in ("config.json", "tokenizer.json") if not (files / n).is_file()]
    if not any((files / n).is_file() for n in WEIGHT_FILES):
        missing.append(f"{', '.join(WEIGHT_FILES[:-1])} or {WEIGHT_FILES[-1]}")
    if missing:
        where = (
            "" if files == path else f" (its Transformer's folder {str(files.relative_to(path))!r})"
        )
        raise FileNotFoundError(f"model directory {str(path)!r}{where} lacks {', '.join(missing)}")
    return path
