"""Checkpoint files in the Hugging Face layout, read without loading what is not needed.

`open_checkpoint(dir)` reads the names, dtypes and shapes of every tensor from the file headers
(no tensor data), so a configuration can be checked against the checkpoint before anything is
allocated; tensors are then read one at a time, straight into the memory that keeps them.

Files, in order of preference: model.safetensors; model.safetensors.index.json (shards);
pytorch_model.bin (a pickled state dict, read with `weights_only=True`). Safetensors files are
read with plain file reads into the destination tensor, not memory-mapped: a mapped file's pages
count as resident memory while they are mapped, and would double the peak.

Safetensors layout (github.com/huggingface/safetensors): an 8-byte little-endian header length
N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
...}, then the data, offsets relative to its start.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .spans import first_overlap

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN)

# safetensors dtype names -> torch dtypes (those torch has)
_SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
WEIGHT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_MAX_HEADER = 100 * 2**20  # the format's own limit


@dataclass(frozen=True)
class TensorInfo:
    dtype: torch.dtype | str  # a str names a dtype torch lacks (e.g. "U16")
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class _Span:  # where one tensor's bytes lie in a safetensors file
    path: Path
    begin: int
    end: int


def describe_dtype(dtype: torch.dtype | str) -> str:
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


class Checkpoint:
    """A checkpoint's tensor names, dtypes and shapes (`infos`), and `read` for one tensor."""

    def __init__(self, source: str, infos: dict[str, TensorInfo]) -> None:
        self.source = source  # the file (or files) it was read from, for messages
        self.infos = infos

    def read(self, name: str, out: Tensor | None = None) -> Tensor:
        """The tensor `name` (CPU, stored dtype); with `out`, copied into it (and returned)."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StateDictCheckpoint(Checkpoint):
    """Tensors already in memory (a state dict), or memory-mapped by torch.load."""

    def __init__(self, tensors: dict[str, Tensor], source: str = "state dict") -> None:
        bad = [k for k, v in tensors.items() if not isinstance(v, Tensor)]
        if bad:
            raise ValueError(f"{source} holds values that are not tensors: {', '.join(bad[:5])}")
        infos = {k: TensorInfo(v.dtype, tuple(v.shape)) for k, v in tensors.items()}
        super().__init__(source, infos)
        self._tensors = tensors

    def read(self, name: str, out: Tensor | None = None) -> Tensor:
        t = self._tensors[name]
        return t if out is None else out.copy_(t)


class SafetensorsCheckpoint(Checkpoint):
    def __init__(self, files: list[Path], source: str) -> None:
        infos: dict[str, TensorInfo] = {}
        self._spans: dict[str, _Span] = {}
        for path in files:
            for name, (info, span) in _read_header(path).items():
                if name in infos:
                    raise ValueError(f"{source}: tensor {name!r} appears in two shards")
                infos[name], self._spans[name] = info, span
        super().__init__(source, infos)
        self._handles: dict[Path, BufferedReader] = {}

    def read(self, name: str, out: Tensor | None = None) -> Tensor:
        info, span = self.infos[name], self._spans[name]
        if isinstance(info.dtype, str):
            raise ValueError(f"{name}: torch has no dtype for safetensors {info.dtype}")
        direct = (
            out is not None
            and out.dtype == info.dtype
            and out.device.type == "cpu"
            and out.is_contiguous()
            and tuple(out.shape) == info.shape
        )
        target = out if direct else torch.empty(info.shape, dtype=info.dtype)
        assert target is not None
        size = span.end - span.begin
        if size:
            f = self._handles.get(span.path)
            if f is None:
                f = self._handles[span.path] = open(span.path, "rb")  # noqa: SIM115
            f.seek(span.begin)
            buffer: Any = target.view(-1).view(torch.uint8).numpy()  # the tensor's own bytes
            got = f.readinto(buffer)
            if got != size:
                raise ValueError(_corrupted(span.path, f"tensor {name!r} is cut short"))
        if out is not None and not direct:
            out.copy_(target)
            return out
        return target

    def close(self) -> None:
        for f in self._handles.values():
            f.close()
        self._handles.clear()


def _corrupted(path: Path, detail: str) -> str:
    return f"cannot read {str(path)!r}: the safetensors file is corrupted or truncated ({detail})"


def _read_header(path: Path) -> dict[str, tuple[TensorInfo, _Span]]:
    """Every tensor's dtype, shape and byte span, from the header alone; ValueError if the
    header is malformed or points past the end of the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(_corrupted(path, f"{size} bytes, shorter than a header"))
            n = int.from_bytes(head, "little")
            if n > min(size - 8, _MAX_HEADER):
                raise ValueError(_corrupted(path, f"header length {n} for a {size}-byte file"))
            raw = f.read(n)
    except OSError as e:
        raise ValueError(f"cannot read {str(path)!r}: {e}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(_corrupted(path, f"header is not JSON: {e}")) from None
    if not isinstance(header, dict):
        raise ValueError(_corrupted(path, "header is not a JSON object"))
    data_start, data_size = 8 + n, size - 8 - n
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_name, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            shape = tuple(shape)
            ok = all(isinstance(d, int) and d >= 0 for d in shape)
            ok = ok and isinstance(begin, int) and isinstance(end, int)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(_corrupted(path, f"bad header entry for {name!r}"))
        dtype: torch.dtype | str = _SAFETENSORS_DTYPES.get(dtype_name, dtype_name)
        itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else _itemsize(dtype_name)
        if itemsize is None:
            raise ValueError(_corrupted(path, f"unknown dtype {dtype_name!r} of {name!r}"))
        if not 0 <= begin <= end <= data_size or end - begin != math.prod(shape) * itemsize:
            raise ValueError(
                _corrupted(path, f"{name!r} spans bytes {begin}..{end} of {data_size}")
            )
        out[name] = (TensorInfo(dtype, shape), _Span(path, data_start + begin, data_start + end))
    _check_tiling(
        path,
        {name: (span.begin - data_start, span.end - data_start) for name, (_, span) in out.items()},
        data_size,
    )
    return out


def _check_tiling(path: Path, offsets: dict[str, tuple[int, int]], data_size: int) -> None:
    """The format's rule (as `safetensors` enforces it): the tensors' byte spans tile the data
    exactly, in order, with no overlap (two tensors aliasing the same bytes would load as one
    silently), no hole and nothing after the last one."""
    overlap = first_overlap(offsets)
    if overlap is not None:
        a, b = overlap
        begin, end = offsets[b]
        raise ValueError(_corrupted(path, f"{b!r} (bytes {begin}..{end}) and {a!r} overlap"))
    at = 0
    for name, (begin, end) in sorted(offsets.items(), key=lambda kv: (kv[1], kv[0])):
        if begin > at:
            raise ValueError(
                _corrupted(
                    path, f"a hole: bytes {at}..{begin} belong to no tensor (before {name!r})"
                )
            )
        at = max(at, end)
    if at != data_size:
        raise ValueError(_corrupted(path, f"{data_size - at} bytes after the last tensor"))


def _itemsize(dtype_name: str) -> int | None:
    """Bytes per element of safetensors dtypes torch may lack."""
    sizes = {"U16": 2, "U32": 4, "U64": 8, "F8_E8M0": 1, "F4": 1, "F6_E2M3": 1, "F6_E3M2": 1}
    return sizes.get(dtype_name)


def _read_index(model_dir: Path) -> list[Path]:
    index_path = model_dir / SAFETENSORS_INDEX
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        files = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read {str(index_path)!r} as a shard index: {e}") from None
    paths = []
    for name in files:
        path = model_dir / name
        if not isinstance(name, str) or Path(name).name != name or not path.is_file():
            raise FileNotFoundError(f"{str(index_path)!r} names a shard that is missing: {name!r}")
        paths.append(path)
    return paths


def _check_index(model_dir: Path, checkpoint: SafetensorsCheckpoint) -> None:
    index = json.loads((model_dir / SAFETENSORS_INDEX).read_text(encoding="utf-8"))
    wrong = [
        f"{k} ({v})"
        for k, v in index["weight_map"].items()
        if k not in checkpoint.infos or checkpoint._spans[k].path.name != v
    ]
    if wrong:
        raise ValueError(
            f"{SAFETENSORS_INDEX} places tensors in shards that do not hold them: "
            + ", ".join(wrong[:10])
        )


def _read_torch_bin(path: Path) -> StateDictCheckpoint:
    try:
        try:  # memory-mapped: nothing is read until a tensor is used
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # legacy format
    except Exception as e:  # torch raises many types for a bad pickle
        raise ValueError(
            f"cannot read {str(path)!r}: corrupted or not a state dict ({e})"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(f"{str(path)!r} does not hold a state dict")
    return StateDictCheckpoint(state, str(path))


def open_checkpoint(model_dir: Path) -> Checkpoint:
    """The weights of a model directory (see the module docstring for the files it reads)."""
    if (model_dir / SAFETENSORS).is_file():
        return SafetensorsCheckpoint([model_dir / SAFETENSORS], str(model_dir / SAFETENSORS))
    if (model_dir / SAFETENSORS_INDEX).is_file():
        checkpoint = SafetensorsCheckpoint(
            _read_index(model_dir), str(model_dir / SAFETENSORS_INDEX)
        )
        _check_index(model_dir, checkpoint)
        return checkpoint
    if (model_dir / TORCH_BIN).is_file():
        return _read_torch_bin(model_dir / TORCH_BIN)
    raise FileNotFoundError(
        f"model directory {str(model_dir)!r} lacks {', '.join(WEIGHT_FILES[:-1])} or {TORCH_BIN}"
    )


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {str(path)!r} as JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data
