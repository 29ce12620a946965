"""Models named on the command line, checked before anything slow. The name is resolved by
the library (`multihead.models.source.resolve_model`: a directory, a .gguf file, a packaged
name, a Hub id in the local cache); a GGUF file's header is read, and a directory's
config.json, weights and tokenizer.json can be read (a truncated safetensors file is caught from
its header, in milliseconds). In a sentence-transformers directory those are the Transformer's
files, in the folder its modules.json names (0_Transformer/ in older ones). Torch is imported
only to resolve a packaged model name."""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..models.source import DEFAULT_MODEL as DEFAULT_MODEL  # the commands' default
from ..models.source import ModelNotFoundError, ModelSource, resolve_model
from .errors import UsageError

LAYOUT = "config.json, model.safetensors or pytorch_model.bin, tokenizer.json"
SHARD_INDEX = "model.safetensors.index.json"
# model_type values that load_encoder and load_causal_lm read (literals: the CLI checks before
# importing torch; tests keep them equal to models.ENCODER_FAMILIES and CAUSAL_LM_FAMILIES)
ENCODER_TYPES = (
    "bert",
    "distilbert",
    "electra",
    "modernbert",
    "mpnet",
    "roberta",
    "xlm-roberta",
)
CAUSAL_LM_TYPES = ("gpt2", "llama", "mistral", "qwen2", "gpt_neox", "phi3")


@dataclass(frozen=True)
class ModelDir:
    name: str  # as given on the command line
    path: Path
    config: dict[str, Any]
    option: str = "--model"
    # where config.json, the weights and tokenizer.json are, when not in `path` itself (a
    # sentence-transformers Transformer's subfolder); `folder` is the one to read
    transformer_dir: Path | None = None

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


def _resolve(name: str, option: str) -> ModelSource:
    """What `name` names (the library's rule: directory, .gguf file, packaged name, cached Hub
    id), its error said as the command line's."""
    try:
        return resolve_model(name)
    except ModelNotFoundError as e:
        message, given = str(e), f"model {name!r}"
        rest = message[len(given) :] if message.startswith(given) else f": {message}"
        raise UsageError(f"{option} {name!r}{rest}") from None


def _check_gguf(name: str, path: Path, option: str, tokenizer: bool) -> ModelDir:
    """A GGUF file's header read (no tensor data): the config.json it amounts to, and its
    tokenizer's kind when one is needed."""
    from ..models.gguf import check_gguf_tokenizer, read_gguf  # imports torch

    try:
        _, meta, config = read_gguf(path)
        if tokenizer:
            check_gguf_tokenizer(meta)
    except ValueError as e:
        raise UsageError(f"{option} {name!r}: {e}") from None
    return ModelDir(name, path, config, option)


def _transformer_dir(name: str, path: Path, option: str) -> Path | None:
    from ..model_layout import transformer_folder  # reads modules.json; no torch

    try:
        folder = transformer_folder(path)
    except ValueError as e:
        raise UsageError(f"{option} {name!r}: {e}") from None
    return None if folder == path else folder


def _check_files(model: ModelDir, tokenizer: bool) -> None:
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


def _check_safetensors(model: ModelDir, file: Path) -> None:
    from safetensors import safe_open

    try:  # reads the header and checks it against the file's size; loads no tensor
        with safe_open(str(file), framework="numpy") as f:
            count = len(list(f.keys()))
    except Exception as e:  # the Rust side raises its own exception types
        raise model.error(f"{file.name} is truncated or corrupted ({e})") from None
    if count == 0:
        raise model.error(f"{file.name} holds no tensors")


def _shards(model: ModelDir, index: Path) -> list[str]:
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


def _check_weights(model: ModelDir) -> None:
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


def _check_tokenizer(model: ModelDir) -> None:
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


def check_model(name: str, option: str = "--model", *, tokenizer: bool = True) -> ModelDir:
    """The model directory behind `name`, with every file it needs readable (tokenizer.json
    unless `tokenizer=False`: a decoder benchmarked on random token ids needs none)."""
    source = _resolve(name, option)
    if source.is_gguf:
        return _check_gguf(name, source.path, option, tokenizer)
    path = source.path
    model = ModelDir(name, path, {}, option, _transformer_dir(name, path, option))
    _check_files(model, tokenizer)
    model = replace(model, config=_read_config(name, model.folder, option))
    _check_weights(model)
    if tokenizer:
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


def load_subject(model: ModelDir, command: str):
    """What `inspect` and `heads` analyse: an `EncoderSubject` for a BERT-family encoder, a
    `CausalLMSubject` for a causal LM: native families as they are, other decoder-only
    architectures through the bridge (which refuses, by name, those it cannot route). An
    encoder-decoder is refused here, before anything loads."""
    native = ENCODER_TYPES + CAUSAL_LM_TYPES
    if model.model_type not in native and is_encoder_decoder(model.config):
        raise model.error(
            f"`multihead {command}` reads BERT-family encoders (model_type "
            f"{', '.join(map(repr, ENCODER_TYPES))}) and causal LMs (model_type "
            f"{', '.join(map(repr, CAUSAL_LM_TYPES))} natively, other decoder-only models "
            f"through the bridge); this model's config.json says model_type "
            f"{model.model_type!r}, an encoder-decoder"
        )
    from ..interpret.subject import EncoderSubject
    from ..interpret.subject import load_subject as load

    try:
        if model.model_type in ENCODER_TYPES:
            return EncoderSubject(load_sentence_encoder(model, command))
        return load(model.path)
    except (ValueError, OSError) as e:  # the checkpoint does not fit its config, and the like
        raise model.error(" ".join(str(e).split())) from None


# model_types of encoder-decoders (their config.json usually says is_encoder_decoder too)
ENCODER_DECODER_TYPES = (
    "t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus",
    "marian", "whisper", "blenderbot", "prophetnet", "led", "encoder-decoder",
)  # fmt: skip


def is_encoder_decoder(config: dict[str, Any]) -> bool:
    return bool(config.get("is_encoder_decoder")) or config.get("model_type") in (
        ENCODER_DECODER_TYPES
    )
