"""Where a model directory keeps its files, read without torch (the CLI checks directories with
it before loading anything).

A sentence-transformers directory lists its pipeline in modules.json. Its Transformer's files
(config.json, the weights, tokenizer.json, tokenizer_config.json, sentence_bert_config.json)
sit in the folder that entry names: the directory itself since sentence-transformers 3
(path ""), or a subfolder such as 0_Transformer/ in directories saved by earlier versions.
Pooling and Normalize folders, modules.json and config_sentence_transformers.json stay at the
top. Without modules.json, everything is at the top (a plain Hugging Face directory).
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath


def module_entries(model_dir: Path) -> list[dict] | None:
    """modules.json's entries in pipeline order, or None when there is no modules.json."""
    path = model_dir / "modules.json"
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {str(path)!r} as JSON: {e}") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{str(path)!r} must hold a list of modules")
    return sorted(entries, key=lambda e: e.get("idx", 0))


def module_kind(entry: dict) -> str:
    """'Transformer', 'Pooling', ... from the entry's dotted class name."""
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def module_folder(model_dir: Path, entry: dict) -> Path:
    """The folder a modules.json entry names: a relative path inside `model_dir` (ValueError
    for an absolute path, '..' or a drive; a module's files must not come from elsewhere)."""
    sub = entry.get("path", "")
    where = f"{str(model_dir / 'modules.json')!r}: the {module_kind(entry)}'s path"
    if not isinstance(sub, str):
        raise ValueError(f"{where} must be a string, got {sub!r}")
    parts = PurePosixPath(sub.replace("\\", "/")).parts
    if sub.startswith(("/", "\\")) or ".." in parts or ":" in sub:
        raise ValueError(f"{where} {sub!r} must be a folder inside the model directory")
    folder = model_dir.joinpath(*parts)
    if not folder.is_dir():
        raise ValueError(f"{where} names {sub!r}, which is not a folder in the model directory")
    return folder


def transformer_folder(model_dir: Path) -> Path:
    """The folder holding the transformer's own files: `model_dir`, or the subfolder that
    modules.json's Transformer entry names (ValueError when that folder is not a relative
    path inside `model_dir`, or is missing)."""
    entries = module_entries(model_dir)
    transformers = [e for e in entries or () if module_kind(e) == "Transformer"]
    if not transformers:
        return model_dir
    return module_folder(model_dir, transformers[0])
