"""A GGUF file's header: metadata, tensor names, types, shapes and where their bytes lie.

GGUF (github.com/ggml-org/ggml/blob/master/docs/gguf.md), little-endian:
  magic "GGUF", version u32, tensor count u64, metadata count u64,
  metadata: key (u64 length + UTF-8), value type u32, value (arrays: item type u32, count u64,
  items), tensor infos: name, n_dims u32, dims u64 (ggml order: fastest-varying first),
  type u32, offset u64 (from the data section), then padding to `general.alignment` (32) and
  the data.

Why not `gguf.GGUFReader`: it builds a numpy view per metadata item, and a tokenizer's 100,000
strings make that 5-9 s on this machine for SmolLM2 (most of a 10 s load budget). This reader
parses the header with `struct` (about 0.1 s) and keeps gguf's own constants and block sizes;
the tests check it against GGUFReader field by field. Every read is bounds-checked, so a
truncated or corrupt file is a ValueError naming it, never an IndexError from deep inside.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType
from gguf import GGUFValueType as V

from ..spans import first_overlap

SUPPORTED_VERSIONS = (2, 3)
_SCALARS = {
    V.UINT8: "B",
    V.INT8: "b",
    V.UINT16: "H",
    V.INT16: "h",
    V.UINT32: "I",
    V.INT32: "i",
    V.FLOAT32: "f",
    V.BOOL: "?",
    V.UINT64: "Q",
    V.INT64: "q",
    V.FLOAT64: "d",
}
_MAX_DIMS = 8  # ggml's GGML_MAX_DIMS is 4; a larger count is corruption
# Metadata arrays: the largest real ones are tokenizers' (about 260,000 tokens or merges);
# llama.cpp reads no nested arrays at all. Past these, a file is corrupt or hostile.
MAX_ARRAY_ITEMS = 2**24
MAX_ARRAY_DEPTH = 4


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy/torch order: slowest-varying first (ggml's dims reversed)
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class GGUFError(ValueError):
    """A file that is not a GGUF this reader can use (the message names the file)."""


class _Cursor:
    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.pos, self.path = data, 0, path

    def fail(self, detail: str) -> GGUFError:
        return GGUFError(f"{str(self.path)!r} is not a readable GGUF file: {detail}")

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise self.fail(f"truncated (header ends at byte {len(self.data)})")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise self.fail(f"truncated (a {n}-byte string at byte {self.pos})")
        raw = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")  # llama.cpp writes some invalid tokens

    def value(self, kind: int, key: str, depth: int = 0) -> Any:
        if kind == V.STRING:
            return self.string()
        if kind == V.ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.fail(
                    f"metadata {key!r} holds arrays nested more than {MAX_ARRAY_DEPTH} deep"
                )
            item, count = self.take("<I"), self.take("<Q")
            self._check_count(key, item, count)
            if item in _SCALARS:  # one unpack for the whole array
                fmt = f"<{count}{_SCALARS[V(item)]}"
                values = list(struct.unpack_from(fmt, self.data, self.pos))
                self.pos += struct.calcsize(fmt)
                return values
            return [self.value(item, key, depth + 1) for _ in range(count)]
        try:
            return self.take("<" + _SCALARS[V(kind)])
        except (ValueError, KeyError):
            raise self.fail(f"metadata {key!r} has unknown value type {kind}") from None

    def _check_count(self, key: str, item: int, count: int) -> None:
        """An array's item count against the bytes left (each item's smallest size) and a
        cap, before a single item is unpacked."""
        if count > MAX_ARRAY_ITEMS:
            raise self.fail(
                f"metadata {key!r} claims {count} items, more than the {MAX_ARRAY_ITEMS} "
                "a GGUF array may hold here"
            )
        if item in _SCALARS:
            smallest = struct.calcsize("<" + _SCALARS[V(item)])
        elif item in (V.STRING, V.ARRAY):
            smallest = 8 if item == V.STRING else 12  # a length; an item type and a count
        else:
            raise self.fail(f"metadata {key!r} has unknown item type {item}")
        left = len(self.data) - self.pos
        if count * smallest > left:
            raise self.fail(
                f"metadata {key!r} claims {count} items of at least {smallest} bytes; "
                f"{left} bytes are left in the file (truncated or corrupt)"
            )


class GGUFFile:
    """`metadata` (key -> Python value) and `tensors` (name -> GGUFTensor) of one GGUF file;
    tensor data is read later, tensor by tensor (`read_bytes`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._handle: BufferedReader | None = None
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                self._check_start(_Cursor(f.read(8), self.path))
                if size == 0:
                    raise _Cursor(b"", self.path).fail("empty file")
                # mapped, so only the header's pages are read; closed before any tensor is
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    self._parse(_Cursor(mapped, self.path), size)  # type: ignore[arg-type]
        except OSError as e:
            raise GGUFError(f"cannot read {str(self.path)!r}: {e}") from None

    def _check_start(self, c: _Cursor) -> None:
        if len(c.data) < 4 or c.take("<I") != GGUF_MAGIC:
            raise c.fail("it does not start with the GGUF magic bytes")
        version = c.take("<I")
        if version & 0xFFFF == 0 and version:
            raise c.fail("it is big-endian; multihead reads little-endian GGUF files")
        if version not in SUPPORTED_VERSIONS:
            newer = " (a newer format than this reader knows)" if version > 3 else ""
            raise c.fail(
                f"GGUF version {version}{newer}; multihead reads versions "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))}"
            )
        self.version = version

    def _parse(self, c: _Cursor, size: int) -> None:
        self._check_start(c)
        n_tensors, n_kv = c.take("<Q"), c.take("<Q")
        if n_tensors > size or n_kv > size:
            raise c.fail(f"it claims {n_tensors} tensors and {n_kv} metadata entries")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            self.metadata[key] = c.value(c.take("<I"), key)
        infos = []
        names: set[str] = set()
        for _ in range(n_tensors):
            name = c.string()
            if name in names:  # the last one would win silently
                raise c.fail(f"tensor {name!r} is described twice")
            names.add(name)
            n_dims = c.take("<I")
            if n_dims > _MAX_DIMS:
                raise c.fail(f"tensor {name!r} claims {n_dims} dimensions")
            dims = [c.take("<Q") for _ in range(n_dims)]
            infos.append((name, dims, c.take("<I"), c.take("<Q")))
        alignment = self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise c.fail(f"general.alignment {alignment!r} is not a power of two")
        start = c.pos + (-c.pos % alignment)
        self.tensors: dict[str, GGUFTensor] = {}
        for name, dims, kind, offset in infos:
            if offset % alignment:
                raise c.fail(
                    f"tensor {name!r} starts at data offset {offset}, not a multiple of the "
                    f"alignment {alignment}"
                )
            self.tensors[name] = self._tensor(c, name, dims, kind, start + offset, size)
        spans = {t.name: (t.offset, t.offset + t.nbytes) for t in self.tensors.values()}
        overlap = first_overlap(spans)
        if overlap is not None:
            a, b = overlap
            raise c.fail(
                f"tensors {a!r} (bytes {spans[a][0]}..{spans[a][1]}) and {b!r} (bytes "
                f"{spans[b][0]}..{spans[b][1]}) overlap"
            )

    def _tensor(
        self, c: _Cursor, name: str, dims: list[int], kind: int, offset: int, size: int
    ) -> GGUFTensor:
        try:
            qtype = GGMLQuantizationType(kind)
        except ValueError:
            raise c.fail(f"tensor {name!r} has unknown type {kind}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        if dims and dims[0] % block:
            raise c.fail(f"tensor {name!r}: {dims[0]} values per row, not a multiple of {block}")
        nbytes = math.prod(dims) // block * type_size
        if offset + nbytes > size:
            raise c.fail(
                f"truncated: tensor {name!r} needs bytes {offset}..{offset + nbytes} of a "
                f"{size}-byte file"
            )
        return GGUFTensor(name, qtype, tuple(reversed(dims)), offset, nbytes)

    def read_bytes(self, tensor: GGUFTensor, out: Any, skip: int = 0) -> None:
        """Fills `out` with `tensor`'s stored bytes from byte `skip` on. Plain reads, not a
        memory map: mapped pages would count as resident memory."""
        if self._handle is None:
            self._handle = open(self.path, "rb")  # noqa: SIM115 (closed by close())
        self._handle.seek(tensor.offset + skip)
        if self._handle.readinto(out) != out.nbytes:
            raise GGUFError(f"{str(self.path)!r}: tensor {tensor.name!r} is cut short")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
