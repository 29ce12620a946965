"""Rotary position embeddings (RoPE, Su et al. 2021): pure functions plus a module caching cos/sin.

Convention: the "rotate half" layout of GPT-NeoX / LLaMA: dimension i pairs with i + D/2.
Shapes: x (B, H, T, D); positions (T,) or (B, T); cos/sin broadcast to x.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .scheme import PositionScheme


def _check_head_dim(head_dim: int) -> None:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"RoPE needs a positive, even head_dim, got {head_dim!r}")


def rope_frequencies(head_dim: int, base: float = 10000.0) -> Tensor:
    """(D/2,) inverse frequencies base^(-2i/D)."""
    _check_head_dim(head_dim)
    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype=torch.float32) -> tuple[Tensor, Tensor]:
    """cos, sin of shape (*positions.shape, D) for integer (or fractional) positions."""
    angles = positions.to(torch.float64)[..., None] * inv_freq.to(positions.device)  # (..., D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (..., D)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, T, D) by cos/sin of shape (T, D) or (B, T, D)."""
    if cos.dim() == 3:  # per-row positions: (B, T, D) -> (B, 1, T, D)
        cos, sin = cos[:, None], sin[:, None]
    return x * cos + _rotate_half(x) * sin


class RotaryEmbedding(PositionScheme):
    """Rotates q and k by their positions. cos/sin are computed from the positions on every call
    (fp32 angles, as Hugging Face and torchtitan do): no table to outgrow, nothing read from
    tensor values, so it traces; negative positions are refused by the module's input checks."""

    uses_positions = True

    def __init__(self, head_dim: int, *, base: float = 10000.0, max_positions: int = 2048) -> None:
        """`max_positions` is kept for compatibility; nothing is preallocated any more."""
        super().__init__()
        self.head_dim, self.base = head_dim, base
        self.inv_freq: Tensor
        self.register_buffer("inv_freq", rope_frequencies(head_dim, base).float(), persistent=False)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}"

    def check(self, num_heads: int, head_dim: int) -> None:
        if head_dim != self.head_dim:
            raise ValueError(
                f"RotaryEmbedding head_dim {self.head_dim} != the attention's head_dim {head_dim}"
            )

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin of shape (*positions.shape, D)."""
        angles = positions.float()[..., None] * self.inv_freq.to(positions.device)  # (..., D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (..., D)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, T, D), k (B, Hkv, T, D); positions (T,) or (B, T) of those T tokens."""
        if q.shape[-1] != self.head_dim:
            raise ValueError(
                f"q head_dim {q.shape[-1]} != RotaryEmbedding head_dim {self.head_dim}"
            )
        cos, sin = self.cos_sin(positions, q.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def forward(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.rotate(q, k, positions)
