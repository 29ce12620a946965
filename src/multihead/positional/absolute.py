"""Absolute position embeddings: fixed sinusoids (Vaswani et al. 2017) and a learned table."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_positions(length: int, dim: int, *, base: float = 10000.0) -> Tensor:
    """(length, dim): sin at even, cos at odd dimensions, wavelengths base^(2i/dim)."""
    if dim % 2:
        raise ValueError(f"sinusoidal embeddings need an even dim, got {dim}")
    position = torch.arange(length, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(base) / dim))
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)
    return table.float()


class LearnedPositions(nn.Module):
    """A learned table of `max_positions` rows; positions past it raise a clear error."""

    def __init__(self, max_positions: int, dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, dim, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)

    @property
    def max_positions(self) -> int:
        return self.weight.shape[0]

    def forward(self, positions: Tensor) -> Tensor:
        if positions.numel() and int(positions.max()) >= self.max_positions:
            raise ValueError(
                f"position {int(positions.max())} is past the position table "
                f"({self.max_positions} positions)"
            )
        return self.weight[positions]


class SinusoidalPositions(nn.Module):
    """Fixed sinusoids as a non-persistent buffer, grown on demand."""

    def __init__(self, dim: int, *, max_positions: int = 2048) -> None:
        super().__init__()
        self.dim = dim
        self.table: Tensor
        self.register_buffer("table", sinusoidal_positions(max_positions, dim), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        needed = int(positions.max()) + 1 if positions.numel() else 0
        if needed > self.table.shape[0]:
            self.table = sinusoidal_positions(max(needed, 2 * self.table.shape[0]), self.dim).to(
                self.table.device
            )
        return self.table[positions]
