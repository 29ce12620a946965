"""The one interface a position method implements inside attention.

`MultiHeadAttention(position=...)` calls it and never asks which method it is:
- `rotate(q, k, positions)`: rotate this call's queries and keys by their positions (RoPE);
- `bias(q_index, k_index)`: an additive score bias from query and key indices (ALiBi, relative
  position buckets), or None.
Indices are slots along the attended sequence (a query at slot i, keys at slots 0 .. Tk - 1; for
packed or ring-sharded sequences, the global slots), so a bias depends on distances only.
`positions` are what RoPE rotates by: (T,) or (B, T) integers, which may differ from slots (left
padding does not shift a row's positions).

Absolute embeddings (learned, sinusoidal) are added to the token embeddings instead, outside
attention; they live beside this in positional/absolute.py.

Shapes: q (B, H, T, D), k (B, Hkv, T, D); q_index (Tq,), k_index (Tk,); bias (1, H, Tq, Tk).
"""

from __future__ import annotations

from torch import Tensor, nn


class PositionScheme(nn.Module):
    """Base class: no rotation, no bias. Subclasses override what they use."""

    #: Whether `forward(positions=...)` means something to this scheme (RoPE: yes).
    uses_positions: bool = False

    def check(self, num_heads: int, head_dim: int) -> None:
        """Raise ValueError when this scheme cannot serve an attention module of that shape."""

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def bias(self, q_index: Tensor, k_index: Tensor) -> Tensor | None:
        return None
