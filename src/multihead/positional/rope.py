"""Rotary position embeddings (RoPE, Su et al. 2021): pure functions, and a module that computes
cos/sin from each call's positions.

Convention: the "rotate half" layout of GPT-NeoX / LLaMA: dimension i pairs with i + D/2.
Shapes: x (B, H, T, D); positions (T,) or (B, T); cos/sin broadcast to x; inverse frequencies
(D/2,).

Scaling (how checkpoints stretch RoPE past their training length, as Hugging Face's
`rope_scaling` types): "linear" (position interpolation, Chen et al. 2023: frequencies / factor),
"dynamic" (NTK-aware: the base grows with the sequence length once it passes the trained
length) and "llama3" (low frequencies / factor, high ones kept, a smooth ramp between). None of
the three rescales the attention (the attention factor of YaRN / LongRoPE), so none is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .scheme import PositionScheme

SCALING_KINDS = ("linear", "dynamic", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling rule. `original_max_positions`: for "dynamic" the length past which the
    base grows (Hugging Face: max_position_embeddings), for "llama3" the pretraining length
    (original_max_position_embeddings). `low_freq_factor`, `high_freq_factor`: llama3 only."""

    kind: str
    factor: float
    original_max_positions: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.kind not in SCALING_KINDS:
            raise ValueError(f"RoPE scaling kind must be one of {SCALING_KINDS}, got {self.kind!r}")
        if not _finite_number(self.factor) or self.factor < 1:
            raise ValueError(f"RoPE scaling factor must be a number >= 1, got {self.factor!r}")
        if self.kind in ("dynamic", "llama3"):
            n = self.original_max_positions
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(
                    f"{self.kind} RoPE scaling needs original_max_positions, a positive int, "
                    f"got {n!r}"
                )
        if self.kind == "llama3":
            low, high = self.low_freq_factor, self.high_freq_factor
            if not (_finite_number(low) and _finite_number(high) and 0 < low < high):
                raise ValueError(
                    "llama3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor, got "
                    f"{low!r} and {high!r}"
                )


def _finite_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_head_dim(head_dim: int) -> None:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"RoPE needs a positive, even head_dim, got {head_dim!r}")


def rope_frequencies(head_dim: int, base: float = 10000.0) -> Tensor:
    """(D/2,) inverse frequencies base^(-2i/D)."""
    _check_head_dim(head_dim)
    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def linear_scaled_frequencies(inv_freq: Tensor, factor: float) -> Tensor:
    """Position interpolation: every frequency / factor (positions squeezed by `factor`)."""
    return inv_freq / factor


def llama3_scaled_frequencies(inv_freq: Tensor, scaling: RopeScaling) -> Tensor:
    """Llama 3.1: wavelengths longer than original / low_freq_factor are divided by `factor`,
    those shorter than original / high_freq_factor kept, and the band between interpolated
    linearly in original / wavelength."""
    assert scaling.original_max_positions is not None  # checked by RopeScaling
    original = scaling.original_max_positions
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    slow = inv_freq / scaling.factor
    ramp = (original / wavelength - low) / (high - low)  # 0 at the slow end, 1 at the fast end
    smooth = (1 - ramp) * slow + ramp * inv_freq
    out = torch.where(wavelength > original / low, slow, inv_freq)
    between = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(between, smooth, out)


def dynamic_ntk_frequencies(
    head_dim: int, base: float, scaling: RopeScaling, seq_len: Tensor | int
) -> Tensor:
    """(D/2,) float64 inverse frequencies of dynamic NTK scaling for sequences of `seq_len`
    tokens: base * (factor * L / original - (factor - 1)) ** (D / (D - 2)), L = max(seq_len,
    original), so nothing changes up to the trained length. `seq_len` may be a 0-d tensor (no
    Python branch on its value: traceable)."""
    _check_head_dim(head_dim)
    if head_dim < 4:
        raise ValueError(f"dynamic RoPE scaling needs head_dim >= 4, got {head_dim}")
    assert scaling.original_max_positions is not None  # checked by RopeScaling
    original = scaling.original_max_positions
    length = torch.as_tensor(seq_len, dtype=torch.float64).clamp(min=original)
    grown = base * (scaling.factor * length / original - (scaling.factor - 1)) ** (
        head_dim / (head_dim - 2)
    )
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device=length.device) / head_dim
    return 1.0 / grown**exponents


def scaled_rope_frequencies(
    head_dim: int, base: float = 10000.0, scaling: RopeScaling | None = None
) -> Tensor:
    """(D/2,) inverse frequencies after `scaling` (None: plain RoPE). For "dynamic", those of
    sequences up to the trained length, i.e. plain RoPE."""
    inv_freq = rope_frequencies(head_dim, base)
    if scaling is None or scaling.kind == "dynamic":
        return inv_freq
    if scaling.kind == "linear":
        return linear_scaled_frequencies(inv_freq, scaling.factor)
    return llama3_scaled_frequencies(inv_freq, scaling)


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
    tensor values, so it traces; negative positions are refused by the module's input checks.

    `scaling`: a `RopeScaling`. "linear" and "llama3" change the frequencies once; "dynamic"
    computes them per call from the call's largest position (as Hugging Face does), so keys
    cached while decoding keep the rotation they were computed with.
    """

    uses_positions = True

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        max_positions: int = 2048,
        scaling: RopeScaling | None = None,
    ) -> None:
        """`max_positions` is kept for compatibility; nothing is preallocated any more."""
        super().__init__()
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be a RopeScaling or None, got {type(scaling).__name__}")
        if not _finite_number(base) or base <= 1:
            raise ValueError(f"RoPE base must be a number > 1, got {base!r}")
        self.head_dim, self.base, self.scaling = head_dim, base, scaling
        self.inv_freq: Tensor
        inv_freq = scaled_rope_frequencies(head_dim, base, scaling)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    @property
    def dynamic(self) -> bool:
        return self.scaling is not None and self.scaling.kind == "dynamic"

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, scaling={self.scaling}"

    def check(self, num_heads: int, head_dim: int) -> None:
        if head_dim != self.head_dim:
            raise ValueError(
                f"RotaryEmbedding head_dim {self.head_dim} != the attention's head_dim {head_dim}"
            )

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin of shape (*positions.shape, D)."""
        inv_freq = self.inv_freq
        if self.dynamic and positions.numel():
            assert self.scaling is not None
            seq_len = positions.max() + 1  # a 0-d tensor: no host sync
            inv_freq = dynamic_ntk_frequencies(self.head_dim, self.base, self.scaling, seq_len)
        angles = positions.float()[..., None] * inv_freq.float().to(positions.device)  # (..., D/2)
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
