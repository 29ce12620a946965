"""GGUF quantized matrices -> packed modules (`multihead.modules.quantized`), kept packed.

Which form each type takes (blocks from ggml-common.h / gguf-py's quants.py):
- Q4_0 (d; 32 x 4-bit q; x = d (q - 8)) -> int4: scale d as stored (float16), no zero (the
  form's implicit -8 d);
- Q4_1 (d, m; x = d q + m) -> int4: scale d, zero m, both float16 as stored;
- Q4_K (256-value super-blocks: d, dmin, 8 x (6-bit scale sc, 6-bit min mn); x = d sc q -
  dmin mn per 32 values) -> int4: scale d sc, zero -dmin mn in float32 (exact there; float16
  would round them);
- Q8_0 (d; 32 x int8; x = d q) -> int8: scale d (float16 as stored);
- every other type gguf can dequantise (Q5_*, Q6_K, Q2_K, Q3_K, IQ*, ...) -> the file's own
  blocks, dequantised a tile of rows at a time by gguf's dequantiser during each product;
- a type it cannot dequantise: ValueError naming the tensor and type.
A scale (d, dmin or m) that is NaN or infinite is refused by name at load, so no product can
produce a NaN the file did not ask for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q
from torch import Tensor, nn

from ...modules.quantized import PackedRows, QuantizedEmbedding, QuantizedLinear
from ..keymap import Source
from .checkpoint import GGUFCheckpoint, Layout, unpermute_rows
from .dequant import PLAIN, can_dequantize
from .mapped import file_stamp, mapped_bytes
from .reader import GGUFTensor

INT4_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q4_K)


def _f16(raw: np.ndarray) -> np.ndarray:
    return _half(raw).astype(np.float32)


def _half(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None, np.ndarray]:
    d = _half(blocks[:, :, 0:2])[..., 0]  # (N, G) float16, as stored
    return blocks[:, :, 2:18], d, None, d


def _q4_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    d = _half(blocks[:, :, 0:2])[..., 0]
    m = _half(blocks[:, :, 2:4])[..., 0]
    return blocks[:, :, 4:20], d, m, np.stack([d, m])


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # blocks (N, S, 144): d f16, dmin f16, scales[12], qs[128] (4 chunks of 32 bytes: low
    # nibbles = sub-block 2c, high = 2c + 1)
    N, S, _ = blocks.shape
    d = _f16(blocks[:, :, 0:2])  # (N, S, 1)
    dmin = _f16(blocks[:, :, 2:4])
    sc12 = blocks[:, :, 4:16].astype(np.uint8)
    lo, hi = sc12[..., 0:4], sc12[..., 4:8]
    top = sc12[..., 8:12]
    sc = np.concatenate([lo & 63, (top & 15) | ((lo >> 6) << 4)], axis=-1)  # (N, S, 8)
    mn = np.concatenate([hi & 63, (top >> 4) | ((hi >> 6) << 4)], axis=-1)
    q = blocks[:, :, 16:].reshape(N, S, 4, 32)
    values = np.stack([q & 15, q >> 4], axis=3).reshape(N, S * 8, 32)  # (N, G, 32)
    qs = values[..., :16] | (values[..., 16:] << 4)  # our order: j low, j + 16 high
    scale = (d * sc.astype(np.float32)).reshape(N, S * 8)
    zero = -(dmin * mn.astype(np.float32)).reshape(N, S * 8)
    return qs, scale, zero, np.stack([d, dmin])


def _q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None, np.ndarray]:
    d = _half(blocks[:, :, 0:2])[..., 0]
    return blocks[:, :, 2:34].view(np.int8), d, None, d


_CONVERT: dict[Q, Callable[[np.ndarray], tuple[Any, Any, Any, Any]]] = {
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q4_K: _q4_k,
    Q.Q8_0: _q8_0,
}


def packable(tensor: GGUFTensor, layout: Layout) -> bool:
    """Whether `tensor` stays packed: a quantized matrix whose rows are stored whole (a
    transposed layout, GPT-2's Conv1D, is dequantised at load instead)."""
    return (
        tensor.qtype not in PLAIN
        and len(tensor.shape) == 2
        and not layout.transpose
        and not layout.shift  # (values changed at load: dequantised instead)
    )


def _block_dequantizer(qtype: Q, K: int) -> Callable[[Tensor], Tensor]:
    def dequantize(rows: Tensor) -> Tensor:  # (n, row bytes) uint8 -> (n, K) float32
        values = quants.dequantize(rows.numpy(), qtype)
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).view(-1, K)

    return dequantize


def pack_tensors(
    ck: GGUFCheckpoint,
    keys: tuple[str, ...],
    stamp: tuple[int, int],
    dtype: torch.dtype,
    device: torch.device,
) -> PackedRows:
    """The checkpoint tensors `keys` (rows concatenated, each with its layout) as one packed
    matrix on `device`."""
    sources = [ck._sources[k] for k in keys]
    qtypes = {t.qtype for t, _ in sources}
    first = sources[0][0]
    name = " + ".join(t.name for t, _ in sources)
    if len(qtypes) > 1:  # q, k, v stored in different types: one form cannot hold them
        raise _Mixed()
    qtype = first.qtype
    if not can_dequantize(qtype):
        raise ValueError(
            f"{ck.source}: tensor {first.name!r} is stored as {qtype.name}, a quantisation "
            "type multihead has no kernel for and the installed gguf package cannot dequantise"
        )
    K = first.shape[1]
    block, size = GGML_QUANT_SIZES[qtype]
    parts: list[list[Tensor]] = []
    for tensor, layout in sources:
        with mapped_bytes(ck.file, tensor, stamp) as raw:
            rows = raw.reshape(tensor.shape[0], K // block, size)  # (N, blocks, bytes)
            if qtype in _CONVERT:
                qs, scale, zero, scales = _CONVERT[qtype](rows)
                if not np.isfinite(scales).all():
                    raise ValueError(
                        f"{ck.source}: tensor {tensor.name!r} ({qtype.name}) has a block whose "
                        "scale is NaN or infinite"
                    )
                arrays = [qs.reshape(tensor.shape[0], -1), scale] + ([] if zero is None else [zero])
                pieces = [torch.from_numpy(np.array(a, order="C")) for a in arrays]  # copies
                del qs, scale, zero, scales, arrays
            else:
                pieces = [torch.from_numpy(np.array(rows.reshape(tensor.shape[0], -1)))]
            del rows
        if layout.heads:
            pieces = [unpermute_rows(p, layout.heads) for p in pieces]
        parts.append(pieces)
    merged = [torch.cat(col) if len(col) > 1 else col[0] for col in zip(*parts, strict=True)]
    merged = [p.to(device).contiguous() for p in merged]
    N = sum(t.shape[0] for t, _ in sources)
    if qtype in INT4_TYPES:
        zero = merged[2] if len(merged) > 2 else None  # (Q4_0: none stored)
        return PackedRows("int4", (N, K), merged[0], merged[1], zero, qtype=qtype.name, dtype=dtype)
    if qtype == Q.Q8_0:
        return PackedRows("int8", (N, K), merged[0], merged[1], qtype=qtype.name, dtype=dtype)
    packed = PackedRows(
        "blocks", (N, K), merged[0], dequantize=_block_dequantizer(qtype, K), qtype=qtype.name,
        dtype=dtype,
    )  # fmt: skip
    _check_blocks_finite(packed, ck.source, name)
    return packed


def _check_blocks_finite(packed: PackedRows, source: str, name: str) -> None:
    step = max(1, (1 << 22) // packed.shape[1])
    for a in range(0, packed.shape[0], step):
        w = packed.rows(a, min(packed.shape[0], a + step))
        low, high = torch.aminmax(w)
        if not (torch.isfinite(low) and torch.isfinite(high)):
            raise ValueError(
                f"{source}: tensor {name!r} ({packed.qtype}) has a block whose scale is NaN "
                "or infinite"
            )


class _Mixed(Exception):
    """q, k and v in different types: they are dequantised instead."""


def packer(ck: GGUFCheckpoint) -> Callable[..., set[str]]:
    """The `pack` callback of `load_model`: replaces the model's quantized nn.Linear and
    nn.Embedding modules by packed ones and says which plan targets it filled."""
    stamp = file_stamp(ck.file.path)

    def pack(
        model: nn.Module,
        plan: dict[str, Source],
        names: dict[str, str],
        tied: dict[str, str],
        dtype: torch.dtype,
        device: torch.device,
    ) -> set[str]:
        done: set[str] = set()
        packed_by_key: dict[str, PackedRows] = {}
        for target, source in plan.items():
            prefix, _, leaf = target.rpartition(".")
            if leaf != "weight" or source.transpose:
                continue
            module = model.get_submodule(prefix)
            if not isinstance(module, (nn.Linear, nn.Embedding)):
                continue
            keys = tuple(names.get(k, k) for k in source.keys)
            # a key a checkpoint view makes (a slice of a fused tensor: GPT-NeoX's
            # query_key_value, Phi-3's qkv_proj / gate_up_proj) is not a stored tensor: that
            # target loads dequantised through the view
            if not all(k in ck._sources and packable(*ck._sources[k]) for k in keys):
                continue
            try:
                packed = pack_tensors(ck, keys, stamp, dtype, device)
            except _Mixed:
                continue
            if isinstance(module, nn.Embedding):
                new: nn.Module = QuantizedEmbedding(packed)
            else:
                new = QuantizedLinear(packed, _bias(module, plan, prefix))
            model.set_submodule(prefix, new)
            packed_by_key[target] = packed
            done.add(target)
        for alias, key in tied.items():  # a tied head reads the embedding's packed rows
            if key in packed_by_key:
                prefix = alias.rpartition(".")[0]
                model.set_submodule(prefix, QuantizedLinear(packed_by_key[key]))
                done.add(alias)
        return done

    return pack


def _bias(module: nn.Module, plan: dict[str, Source], prefix: str) -> Tensor | None:
    # a placeholder: the bias is loaded with the other float tensors (assign=True)
    bias = getattr(module, "bias", None)
    return None if bias is None else torch.empty(bias.shape, device="meta")
