"""A GGUF file as a `Checkpoint`: tensors under their Hugging Face names and shapes, each
dequantised on read, straight into the loader's destination (one tensor in flight, so a
bfloat16 load never holds a float32 copy of the model).

A family says how its GGUF tensors map to Hugging Face keys (`GGUFNames`): the name, and a
layout change llama.cpp made when converting (rows of q/k permuted for its rotary layout;
GPT-2's Conv1D matrices transposed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from torch import Tensor

from ..checkpoint import Checkpoint, TensorInfo
from .dequant import PLAIN, can_dequantize, dequantize
from .reader import GGUFFile, GGUFTensor

# integer tensors hold no weights; the rest dequantise to float32 (or keep their float dtype)
_NOT_WEIGHTS = {Q.I8, Q.I16, Q.I32, Q.I64}
_CHUNK_BYTES = 2**20  # stored bytes dequantised at a time (Q4_1: ~7 MB of float32)


def qkv_rows_per_head(rows: Tensor, heads: int) -> Tensor:
    """llama.cpp's q | k | v row blocks as GPT-NeoX's query_key_value rows, each head's
    [q, k, v] together; `rows` may be any per-row data (values, or a packed matrix's rows)."""
    # (3 * H * D, ...) -> (3, H, D, ...) -> (H, 3, D, ...) -> (H * 3 * D, ...)
    blocks = rows.reshape(3, heads, rows.shape[0] // (3 * heads), *rows.shape[1:])
    return blocks.transpose(0, 1).reshape(rows.shape)


@dataclass(frozen=True)
class Layout:
    """How a stored tensor becomes the Hugging Face one: `heads` > 0 undoes llama.cpp's
    rotary row permutation for that many heads; `transpose` swaps a matrix's two axes;
    `qkv_heads` > 0 turns q | k | v row blocks into that many heads' [q, k, v] rows
    (GPT-NeoX's query_key_value); `shift` is added to every value (Gemma's norms: llama.cpp
    stores 1 + w, Hugging Face w)."""

    heads: int = 0
    transpose: bool = False
    qkv_heads: int = 0
    shift: float = 0.0


# GGUF tensor name -> (Hugging Face key, layout), or None for a tensor that is not a weight
GGUFNames = Callable[[str], tuple[str, Layout] | None]


def unpermute_rows(w: Tensor, heads: int) -> Tensor:
    """llama.cpp stores each head's q/k rows interleaved (pairs (2i, 2i+1)); Hugging Face keeps
    the halves (i, i + D/2) apart. Inverse of convert_hf_to_gguf's `permute`."""
    rows = w.shape[0]
    # (H * D/2 * 2, ...) -> (H, D/2, 2, ...) -> (H, 2, D/2, ...) -> (H * D, ...)
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class GGUFCheckpoint(Checkpoint):
    def __init__(self, file: GGUFFile, names: GGUFNames) -> None:
        self.file = file
        self._sources: dict[str, tuple[GGUFTensor, Layout]] = {}
        infos: dict[str, TensorInfo] = {}
        for tensor in file.tensors.values():
            mapped = names(tensor.name)
            if mapped is None:
                continue
            key, layout = mapped
            if tensor.qtype in _NOT_WEIGHTS:
                raise ValueError(
                    f"{str(file.path)!r}: tensor {tensor.name!r} is stored as {tensor.qtype.name} "
                    "(integers), not as weights"
                )
            if not can_dequantize(tensor.qtype):
                raise ValueError(
                    f"{str(file.path)!r}: tensor {tensor.name!r} is stored as "
                    f"{tensor.qtype.name}, a quantisation type the installed gguf package cannot "
                    "dequantise"
                )
            shape = tensor.shape
            if layout.transpose and len(shape) == 2:
                shape = (shape[1], shape[0])
            if layout.qkv_heads and shape[0] % (3 * layout.qkv_heads):
                raise ValueError(
                    f"{str(file.path)!r}: tensor {tensor.name!r} has {shape[0]} rows, not q, k "
                    f"and v of {layout.qkv_heads} heads"
                )
            if layout.heads and shape[0] % (2 * layout.heads):
                raise ValueError(
                    f"{str(file.path)!r}: tensor {tensor.name!r} has {shape[0]} rows, not a "
                    f"whole number of rotary heads ({layout.heads} heads)"
                )
            infos[key] = TensorInfo(PLAIN.get(tensor.qtype, torch.float32), shape)
            self._sources[key] = (tensor, layout)
        super().__init__(str(file.path), infos)

    def close(self) -> None:
        self.file.close()

    def qtypes(self) -> dict[str, int]:
        """How many tensors of each stored type (F32, Q4_1, ...)."""
        counts: dict[str, int] = {}
        for tensor, _ in self._sources.values():
            counts[tensor.qtype.name] = counts.get(tensor.qtype.name, 0) + 1
        return counts

    def read(self, name: str, out: Tensor | None = None) -> Tensor:
        tensor, layout = self._sources[name]
        plain = not (layout.heads or layout.transpose or layout.qkv_heads)
        if out is not None and plain and tensor.shape:
            # rows are stored one after another: dequantise a bounded run of rows at a time
            # into `out`, so the float32 temporary of an embedding matrix is never whole
            rows = tensor.shape[0]
            step = max(1, _CHUNK_BYTES * rows // max(1, tensor.nbytes))
            for start in range(0, rows, step):
                stop = min(rows, start + step)
                out[start:stop].copy_(self._values(tensor, start, stop) + layout.shift)
            return out
        values = self._values(tensor, 0, tensor.shape[0] if tensor.shape else 1)
        if layout.heads:
            values = unpermute_rows(values, layout.heads)
        if layout.qkv_heads:
            values = qkv_rows_per_head(values, layout.qkv_heads)
        if layout.transpose and values.dim() == 2:
            values = values.t()
        if layout.shift:
            values = values + layout.shift
        if out is None:
            return values.contiguous()
        return out.copy_(values)

    def _values(self, tensor: GGUFTensor, start: int, stop: int) -> Tensor:
        """Rows start..stop of `tensor`, dequantised (float32, or the stored float dtype)."""
        rows = tensor.shape[0] if tensor.shape else 1
        row_bytes = tensor.nbytes // max(1, rows)
        raw = np.empty((stop - start) * row_bytes, dtype=np.uint8)
        self.file.read_bytes(tensor, raw, start * row_bytes)
        shape = (stop - start, *tensor.shape[1:]) if tensor.shape else ()
        try:
            return dequantize(raw, tensor.qtype, shape)
        except ValueError as e:
            raise ValueError(f"{self.source}: tensor {tensor.name!r}: {e}") from None
