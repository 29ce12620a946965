"""A model checked before anything slow: `check_model(name)` resolves the name (a directory, a
.gguf file, a packaged name, a Hub id in the local cache: `source.resolve_model`) and reads what
can be read fast: a GGUF file's header; a directory's config.json, its weights' headers (a
truncated safetensors file, a shard index naming missing shards, a pytorch_model.bin that is no
zip or pickle), and tokenizer.json against config.json's vocab_size. In a sentence-transformers
directory those are the Transformer's files, in the folder its modules.json names.

`multihead.load` calls it first, and the `multihead` command's `--model` too (which prints the
error as its one line), so one bad directory gives one message wherever it is named. No torch
here (a GGUF file's header reader imports it), so a mistake is reported in milliseconds.

Errors: `ModelNotFoundError` (nothing readable by that name) and `ModelCheckError` (it is there
but broken), both ValueErrors whose message starts with `model 'NAME':`.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..model_layout import transformer_folder
from .source import ModelNotFoundError, resolve_model

__all__ = ["ModelCheckError", "ModelFiles", "ModelNotFoundError", "check_model"]

LAYOUT = "config.json, model.safetensors or pytorch_model.bin, tokenizer.json"
SHARD_INDEX = "model.safetensors.index.json"


class ModelCheckError(ValueError):
    """A model that is there but cannot be loaded as it is (the message names the file and
    what is wrong with it)."""


@dataclass(frozen=True)
class ModelFiles:
    """A checked model: what `name` resolved to and the config it holds (a GGUF file's
    metadata as the config.json it amounts to)."""

    name: str  # as given
    path: Path  # the directory or the .gguf file
    config: dict[str, Any]
    # where config.json, the weights and tokenizer.json are, when not in `path` itself (a
    # sentence-transformers Transformer's subfolder); `folder` is the one to read
    transformer_dir: Path | None = None
    is_gguf: bool = False
    # a GGUF file whose general.architecture no native family reads (then `config` is empty:
    # `architecture` said the bridge can build it, and multihead.load routes it there)
    gguf_architecture: str | None = None

    @property
    def folder(self) -> Path:
        return self.transformer_dir or self.path

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    def _int(self, *keys: str) -> int | None:
        for key in keys:
            value = self.config.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    @property
    def layers(self) -> int | None:
        return self._int("num_hidden_layers", "n_layer", "num_layers")

    @property
    def heads(self) -> int | None:
        return self._int("num_attention_heads", "n_head", "num_heads")

    @property
    def vocab_size(self) -> int | None:
        return self._int("vocab_size")

    @property
    def max_positions(self) -> int | None:
        return self._int("max_position_embeddings", "n_positions")

    def error(self, problem: str) -> ModelCheckError:
        return ModelCheckError(f"model {self.name!r}: {problem}")


def check_model(
    name: str | os.PathLike[str] | None = None,
    *,
    tokenizer: bool | None = None,
    model_types: Collection[str] | None = None,
    reader: str = "multihead.load",
    architecture: Callable[[ModelFiles], None] | None = None,
) -> ModelFiles:
    """The model behind `name` (None: the packaged default), with every file it needs
    readable. `tokenizer`: True requires a tokenizer (what reads text needs one), None checks
    tokenizer.json where there is one (`multihead.load`: a model without a tokenizer loads, for
    token ids), False skips it. `model_types`: the config.json model_type values `reader`
    reads (None: any), checked as soon as config.json is read. `architecture`: a further check of
    what the config says, run then too (`multihead.load`: can the bridge build a model_type no
    native family reads); its ValueError becomes this model's error. A GGUF file whose
    general.architecture no native family reads is refused, unless `architecture` is given: it
    is then called with that file (`gguf_architecture` set, no config) to accept or refuse it."""
    source = resolve_model(name)
    text = source.name
    if source.is_gguf:  # (its architecture is checked by the GGUF reader)
        return _check_gguf(text, source.path, tokenizer is True, architecture)
    path = source.path
    model = ModelFiles(text, path, {}, _transformer_dir(text, path))
    has_tokenizer = (model.folder / "tokenizer.json").is_file()
    if (model.folder / "config.json").is_file():  # what the model is comes first
        model = replace(model, config=_read_config(model))
        if model_types is not None and model.model_type not in model_types:
            raise model.error(
                f"unsupported architecture: model_type {model.model_type!r}; {reader} reads "
                f"model_type {', '.join(map(repr, sorted(model_types)))}"
            )
        if architecture is not None:
            try:
                architecture(model)
            except ValueError as e:
                raise model.error(str(e)) from None
    _check_files(model, tokenizer is True)
    _check_weights(model)
    if tokenizer or (tokenizer is None and has_tokenizer):
        _check_tokenizer(model)
    return model


def _check_gguf(
    name: str, path: Path, tokenizer: bool, architecture: Callable[[ModelFiles], None] | None
) -> ModelFiles:
    """A GGUF file's header read (no tensor data): the config.json it amounts to, and its
    tokenizer's kind when one is needed. An architecture no native family reads goes to
    `architecture` when there is one (else `read_gguf` refuses it by name)."""
    from .gguf import GGUF_ARCHITECTURES, GGUFFile, check_gguf_tokenizer, read_gguf  # torch

    try:
        arch = GGUFFile(path).metadata.get("general.architecture")
        if architecture is not None and arch not in GGUF_ARCHITECTURES:
            model = ModelFiles(name, path, {}, is_gguf=True, gguf_architecture=str(arch))
            architecture(model)
            return model
        _, meta, config = read_gguf(path)
        if tokenizer:
            check_gguf_tokenizer(meta)
    except ValueError as e:
        raise ModelCheckError(f"model {name!r}: {e}") from None
    return ModelFiles(name, path, config, is_gguf=True)


def _transformer_dir(name: str, path: Path) -> Path | None:
    try:
        folder = transformer_folder(path)  # reads modules.json
    except ValueError as e:
        raise ModelCheckError(f"model {name!r}: {e}") from None
    return None if folder == path else folder


def _check_files(model: ModelFiles, tokenizer: bool) -> None:
    folder = model.folder
    needed = ("config.json", "tokenizer.json") if tokenizer else ("config.json",)
    missing = [n for n in needed if not (folder / n).is_file()]
    weights = ("model.safetensors", SHARD_INDEX, "pytorch_model.bin")
    if not any((folder / n).is_file() for n in weights):
        missing.append("model.safetensors or pytorch_model.bin")
    if missing:
        where = (
            "the directory"
            if model.transformer_dir is None
            else f"its Transformer's folder {str(folder.relative_to(model.path))!r} "
            "(as modules.json says)"
        )
        raise model.error(f"{where} lacks {', '.join(missing)} (a model needs {LAYOUT})")


def _read_config(model: ModelFiles) -> dict[str, Any]:
    file = model.folder / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise model.error(
            f"config.json is not valid JSON ({e.msg}: line {e.lineno}, column {e.colno})"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise model.error(f"cannot read config.json ({e})") from None
    if not isinstance(config, dict):
        raise model.error(f"config.json must hold a JSON object, got {type(config).__name__}")
    return config


def _check_safetensors(model: ModelFiles, file: Path) -> None:
    from safetensors import safe_open

    try:  # reads the header and checks it against the file's size; loads no tensor
        with safe_open(str(file), framework="numpy") as f:
            count = len(list(f.keys()))
    except Exception as e:  # the Rust side raises its own exception types
        raise model.error(f"{file.name} is truncated or corrupted ({e})") from None
    if count == 0:
        raise model.error(f"{file.name} holds no tensors")


def _shards(model: ModelFiles, index: Path) -> list[str]:
    """The shard files a model.safetensors.index.json names, each present."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted({str(v) for v in weight_map.values()})
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise model.error(f"{SHARD_INDEX} is not a shard index (a weight_map)") from None
    missing = [s for s in shards if not (index.parent / s).is_file()]
    if missing or not shards:
        raise model.error(f"{SHARD_INDEX} names shards that are missing: {', '.join(missing)}")
    return shards


def _check_weights(model: ModelFiles) -> None:
    st = model.folder / "model.safetensors"
    if st.is_file():
        _check_safetensors(model, st)
        return
    index = model.folder / SHARD_INDEX
    if index.is_file():
        for shard in _shards(model, index):
            _check_safetensors(model, model.folder / shard)
        return
    binary = model.folder / "pytorch_model.bin"
    with open(binary, "rb") as f:
        magic = f.read(2)
    if magic[:1] == b"\x80":  # torch's legacy (pickle) format: read in full when loaded
        return
    try:
        with zipfile.ZipFile(binary) as z:
            z.namelist()
    except (zipfile.BadZipFile, OSError):
        raise model.error("pytorch_model.bin is truncated or not a PyTorch checkpoint") from None


def _check_tokenizer(model: ModelFiles) -> None:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(model.folder / "tokenizer.json"))
    except Exception as e:  # the Rust side raises its own exception type
        detail = " ".join(str(e).split())[:200]
        raise model.error(f"tokenizer.json cannot be read as a tokenizer ({detail})") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    vocab = model.vocab_size
    if vocab is not None and size > vocab:
        raise model.error(
            f"tokenizer.json has {size} tokens but config.json's vocab_size is {vocab}: the "
            f"tokenizer does not belong to this model"
        )
