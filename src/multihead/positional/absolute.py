"""Absolute position embeddings: fixed sinusoids (Vaswani et al. 2017) and a learned table.

Both are traceable: nothing reads position values on the host (a position past the learned
table is refused where values are free to read; see `multihead.value_checks`), and sinusoids are
computed from the positions on every call, so there is no table to outgrow.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..value_checks import check_below, check_integer


def sinusoids(positions: Tensor, dim: int, *, base: float = 10000.0) -> Tensor:
    """(*positions.shape, dim): sin at even, cos at odd dimensions, wavelengths base^(2i/dim).
    Angles in float64 (float32 where the device has no float64), returned as float32."""
    if dim % 2:
        raise ValueError(f"sinusoidal embeddings need an even dim, got {dim}")
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    div = torch.exp(
        torch.arange(0, dim, 2, dtype=wide, device=positions.device) * (-math.log(base) / dim)
    )
    angles = positions.to(wide)[..., None] * div  # (..., dim / 2)
    # (..., dim / 2, 2) -> (..., dim): sin, cos interleaved
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2).float()


def sinusoidal_positions(length: int, dim: int, *, base: float = 10000.0) -> Tensor:
    """(length, dim): the sinusoids of positions 0 .. length - 1."""
    return sinusoids(torch.arange(length), dim, base=base)


class LearnedPositions(nn.Module):
    """A learned table of `max_positions` rows; positions past it raise a clear error (where
    values are free to read: eager mode on CPU)."""

    def __init__(self, max_positions: int, dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, dim, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)

    @property
    def max_positions(self) -> int:
        return self.weight.shape[0]

    def forward(self, positions: Tensor) -> Tensor:
        check_integer("positions", positions)
        check_below("positions", positions, self.max_positions, "position table")
        return self.weight[positions]


class SinusoidalPositions(nn.Module):
    """Fixed sinusoids of any position, computed on each call (no table, no parameters)."""

    def __init__(self, dim: int, *, max_positions: int = 2048) -> None:
        """`max_positions` is kept for compatibility; nothing is preallocated any more."""
        super().__init__()
        if dim % 2:
            raise ValueError(f"sinusoidal embeddings need an even dim, got {dim}")
        self.dim = dim

    def forward(self, positions: Tensor) -> Tensor:
        check_integer("positions", positions)
        return sinusoids(positions, self.dim)
