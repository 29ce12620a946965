"""ALiBi (Press et al. 2022): a per-head linear distance penalty added to the scores as `bias`.

Shapes: slopes (H,); bias (1, H, Tq, Tk).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


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


class ALiBi(torch.nn.Module):
    """ALiBi as a module for `MultiHeadAttention(position=ALiBi(num_heads))`."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.slopes: Tensor
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def bias(self, tq: int, tk: int, *, device=None) -> Tensor:
        """(1, H, Tq, Tk), bottom-right aligned (the last query is the last key's position)."""
        return alibi_bias(self.slopes, tq, tk, device=device)
