"""Dropout masks that depend only on a seed and global coordinates, so a sharded computation
drops exactly the entries a single process would.

The entry (b, h, i, j) of the attention probabilities (batch row b, query head h, global query
position i, global key position j) is kept iff

    hash(seed, b, h, i, j) >= round(p * 2**32)

where hash is a fixed 32-bit integer mix (below). The mask is therefore the same for every world
size, layout, tile size and device, and the backward pass recomputes it instead of storing it.
Kept entries are scaled by 1 / (1 - p), as `torch.nn.functional.dropout` does.

Shapes: q_index (Tq,), k_index (Tk,) -> keep (B, H, Tq, Tk).
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
# Multipliers of a well-tested 32-bit integer hash ("lowbias32", C. Wellons).
_M1 = 0x7FEB352D
_M2 = 0x846CA68B


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32 in int64 without signed overflow: split x in halves."""
    lo = (x & 0xFFFF) * c  # < 2**48
    hi = ((x >> 16) * c) & 0xFFFF  # only the low 16 bits survive the shift below
    return (lo + (hi << 16)) & _MASK32


def _mix(x: Tensor) -> Tensor:
    """lowbias32 on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def _mix_int(x: int) -> int:
    """`_mix` on a Python int (for the seed: host arithmetic, no tensor)."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * _M1) & _MASK32
    x ^= x >> 15
    x = (x * _M2) & _MASK32
    return x ^ (x >> 16)


def check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"dropout_seed must be an int in [0, 2**63), got {seed!r}")
    return seed


def dropout_keep_mask(
    seed: int, p: float, batch: int, heads: int, q_index: Tensor, k_index: Tensor
) -> Tensor:
    """(B, H, Tq, Tk) boolean mask, True = kept, for global positions `q_index` x `k_index`.

    `ring_attention(..., dropout_p=p, dropout_seed=seed)` and the tiled backend drop exactly
    the entries this mask marks False; compute it over `torch.arange(T)` for both to reproduce
    a run in one process.
    """
    seed = check_seed(seed)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p must be in [0, 1), got {p}")
    device = q_index.device
    # Fold the 63-bit seed into 32 bits by hashing its halves in turn (host ints, no tensors).
    s = _mix_int((seed & _MASK32) ^ _mix_int(seed >> 32))
    rows = torch.arange(batch * heads, device=device, dtype=torch.long).view(batch, heads, 1, 1)
    per_head = _mix(rows ^ s)  # (B, H, 1, 1)
    per_query = _mix(per_head ^ (q_index.long().view(1, 1, -1, 1) & _MASK32))  # (B, H, Tq, 1)
    per_key = _mix((k_index.long() & _MASK32) ^ 0x9E3779B9).view(1, 1, 1, -1)  # (1, 1, 1, Tk)
    bits = _mix(per_query ^ per_key)  # (B, H, Tq, Tk)
    return bits >= round(p * 2**32)
