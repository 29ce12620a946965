"""ALiBi (Press et al. 2022): a per-head linear distance penalty added to the scores as `bias`.

Shapes: slopes (H,); bias (1, H, Tq, Tk).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .scheme import PositionScheme


def alibi_slopes(num_heads: int) -> Tensor:
    """The paper's slopes: 2^(-8i/n) for n a power of two; otherwise those of the largest power of
    two below n, then every other slope of the next power of two."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(closest)
    if closest < num_heads:
        slopes += power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(
    slopes: Tensor, tq: int, tk: int, *, offset: int | None = None, device=None
) -> Tensor:
    """(1, H, Tq, Tk) bias -slope * |position(query) - position(key)|.

    Query i sits at position i + offset; the default offset Tk - Tq aligns the last query with the
    last key (bottom-right), as decoding with a cache needs.
    """
    offset = tk - tq if offset is None else offset
    q_pos = torch.arange(tq, device=device)[:, None] + offset
    k_pos = torch.arange(tk, device=device)[None, :]
    distance = (q_pos - k_pos).abs().to(torch.float32)  # (Tq, Tk)
    return -slopes.to(device)[None, :, None, None] * distance


class ALiBi(PositionScheme):
    """ALiBi as a position scheme: `MultiHeadAttention(position=ALiBi(num_heads))`."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.slopes: Tensor
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"

    def check(self, num_heads: int, head_dim: int) -> None:
        if self.slopes.shape[0] != num_heads:
            raise ValueError(
                f"ALiBi has slopes for {self.slopes.shape[0]} heads but the attention has "
                f"{num_heads} heads: build it as ALiBi({num_heads})"
            )

    def bias(self, q_index: Tensor, k_index: Tensor) -> Tensor:
        """(1, H, Tq, Tk): -slope * |i - j| for query slot i and key slot j."""
        distance = (q_index[:, None] - k_index[None, :]).abs().to(torch.float32)  # (Tq, Tk)
        return -self.slopes.to(distance.device)[None, :, None, None] * distance
