"""GGUF tensor bytes -> a float torch tensor, one tensor at a time.

gguf's own dequantisers (numpy, `gguf.quants.dequantize`) handle every type it knows. Q8_0
(d (f16) then 32 x int8 per block of 32 values, x = d * q; ggml-common.h), the type of most
files' embedding matrix, is done in torch: 3x faster than gguf's numpy on SmolLM2's embedding
and tested equal to it value for value. Torch versions of Q4_0/Q4_1 were measured no faster
than gguf's (their nibble shuffles are memory-bound), so gguf does those.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q
from torch import Tensor

PLAIN = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16, Q.F64: torch.float64}


def _q8_0(blocks: Tensor) -> Tensor:  # (N, 34) uint8 -> (N, 32)
    d = blocks[:, :2].contiguous().view(torch.float16).float()
    q = blocks[:, 2:].contiguous().view(torch.int8).float()
    return q * d


_TORCH_BLOCKS = {Q.Q8_0: (34, _q8_0)}


def dequantize(raw: np.ndarray, qtype: Q, shape: tuple[int, ...]) -> Tensor:
    """The values of one tensor stored as `raw` (uint8 bytes) in type `qtype`, as a CPU tensor
    of `shape`: float32 for quantised types, the stored dtype for F32/F16/BF16/F64."""
    if qtype in PLAIN:
        return torch.from_numpy(raw).view(PLAIN[qtype]).reshape(shape)
    if qtype in _TORCH_BLOCKS:
        size, fn = _TORCH_BLOCKS[qtype]
        return fn(torch.from_numpy(raw).reshape(-1, size)).reshape(shape)
    rows = raw.reshape(-1, raw.size // max(1, int(np.prod(shape[:-1]))))
    try:
        values = quants.dequantize(rows, qtype)
    except NotImplementedError:
        raise ValueError(
            f"GGUF tensor type {qtype.name} cannot be dequantised by the installed gguf package"
        ) from None
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(shape)


@cache
def can_dequantize(qtype: Q) -> bool:
    """Whether `dequantize` handles `qtype` (gguf's dequantisers are tried on one zero block)."""
    if qtype in PLAIN or qtype in _TORCH_BLOCKS:
        return True
    _, size = GGML_QUANT_SIZES[qtype]
    try:
        quants.dequantize(np.zeros((1, size), dtype=np.uint8), qtype)
    except (NotImplementedError, ValueError):
        return False
    return True
