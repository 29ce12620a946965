"""The one interface a position method implements inside attention.

`MultiHeadAttention(position=...)` calls it and never asks which method it is:
- `rotate(q, k, positions)`: rotate this call's queries and keys by their positions (RoPE);
- `bias(q_index, k_index)`: an additive score bias from query and key indices (ALiBi, relative
  position buckets), or None;
- `rotate_heads_(heads, count, positions)` (schemes with `rotates_heads`, RoPE): `rotate` for the
  first `count` heads of one heads-first tensor (a fused projection's queries then keys), written
  in place: the module's plain path (no hooks) rotates q and k in one pass.
Indices are slots along the attended sequence (a query at slot i, keys at slots 0 .. Tk - 1; for
packed or ring-sharded sequences, the global slots), so a bias depends on distances only.
`positions` are what RoPE rotates by: (T,) or (B, T) integers, which may differ from slots (left
padding does not shift a row's positions).

Absolute embeddings (learned, sinusoidal) are added to the token embeddings instead, outside
attention; they live beside this in positional/absolute.py.

Shapes: q (B, H, T, D), k (B, Hkv, T, D); q_index (Tq,), k_index (Tk,); bias (1, H, Tq, Tk).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PositionScheme(nn.Module):
    """Base class: no rotation, no bias. Subclasses override what they use."""

    #: Whether `forward(positions=...)` means something to this scheme (RoPE: yes).
    uses_positions: bool = False
    #: Whether the scheme only rotates (no bias) and implements `rotate_heads_`.
    rotates_heads: bool = False

    def check(self, num_heads: int, head_dim: int) -> None:
        """Raise ValueError when this scheme cannot serve an attention module of that shape."""

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def bias(self, q_index: Tensor, k_index: Tensor) -> Tensor | None:
        return None

    def has_tables(self, positions: Tensor, dtype: torch.dtype) -> bool:
        """Whether this forward already rotated by this very `positions` tensor (and so its
        caller checked it): the plain path then reads no values again. Default: False."""
        return False

    def rotate_heads_(self, heads: Tensor, count: int, positions: Tensor) -> None:
        """Rotate heads[:, :count] (B, count, T, D) in place, as `rotate` rotates q and k
        (schemes with `rotates_heads`)."""
        raise NotImplementedError(f"{type(self).__name__} does not rotate heads in place")
