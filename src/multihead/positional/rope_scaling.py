"""RoPE scaling rules: how checkpoints stretch rotary embeddings past their training length
(Hugging Face's `rope_scaling` / `rope_parameters` types), as pure functions of the inverse
frequencies (D/2,) of the rotated width D.

- "linear" (position interpolation, Chen et al. 2023): every frequency / factor;
- "dynamic" (NTK-aware): the base grows with the sequence length once past the trained length;
- "llama3" (Llama 3.1): low frequencies / factor, high ones kept, a smooth ramp between;
- "yarn" (Peng et al. 2023): interpolated and extrapolated frequencies blended by a ramp over
  the dimensions, and cos/sin multiplied by an attention factor (0.1 ln(factor) + 1 by default);
- "longrope" (Phi-3): every frequency divided by a per-dimension factor, the short factors up to
  original_max_positions and the long ones past it (chosen per call from its largest position),
  and cos/sin multiplied by sqrt(1 + ln(factor) / ln(original)) by default;
- "factors": per-dimension divisors read from a file (llama.cpp's rope_freqs tensor, which it
  writes for Llama 3.1 instead of the config's numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

SCALING_KINDS = ("linear", "dynamic", "llama3", "yarn", "longrope", "factors")


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling rule. `original_max_positions`: for "dynamic" the length past which the
    base grows (Hugging Face: max_position_embeddings), for "llama3", "yarn" and "longrope" the
    pretraining length (original_max_position_embeddings). `low_freq_factor`,
    `high_freq_factor`: llama3. `beta_fast`, `beta_slow`, `truncate`: yarn's ramp.
    `attention_factor`: what cos/sin are multiplied by (None: the kind's default).
    `short_factor`, `long_factor`: longrope's per-dimension divisors (D/2 each); "factors" uses
    `short_factor` alone."""

    kind: str
    factor: float
    original_max_positions: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in SCALING_KINDS:
            raise ValueError(f"RoPE scaling kind must be one of {SCALING_KINDS}, got {self.kind!r}")
        minimum = 0 if self.kind in ("longrope", "factors") else 1
        if not _finite_number(self.factor) or self.factor < minimum or self.factor == 0:
            raise ValueError(f"RoPE scaling factor must be a number >= 1, got {self.factor!r}")
        if self.kind in ("dynamic", "llama3", "yarn", "longrope"):
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
        if self.kind == "yarn" and not (
            _finite_number(self.beta_fast)
            and _finite_number(self.beta_slow)
            and 0 < self.beta_slow < self.beta_fast
        ):
            raise ValueError(
                f"yarn RoPE scaling needs 0 < beta_slow < beta_fast, got {self.beta_slow!r} "
                f"and {self.beta_fast!r}"
            )
        if self.attention_factor is not None and not (
            _finite_number(self.attention_factor) and self.attention_factor > 0
        ):
            raise ValueError(
                f"RoPE attention_factor must be a positive number, got {self.attention_factor!r}"
            )
        wanted = {"longrope": ("short_factor", "long_factor"), "factors": ("short_factor",)}
        for name in wanted.get(self.kind, ()):
            values = getattr(self, name)
            if not values or not all(_finite_number(v) and v > 0 for v in values):
                raise ValueError(
                    f"{self.kind} RoPE scaling needs {name}, positive numbers (one per rotated "
                    f"pair), got {values!r}"
                )

    @property
    def attention_scale(self) -> float:
        """What cos and sin are multiplied by (so attention scores by its square)."""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.kind == "yarn":
            return 1.0 if self.factor <= 1 else 0.1 * math.log(self.factor) + 1.0
        if self.kind == "longrope":
            assert self.original_max_positions is not None  # checked above
            if self.factor <= 1:
                return 1.0
            return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_positions))
        return 1.0

    def check_width(self, rotary_dim: int) -> None:
        """Per-dimension factors must hold one number per rotated pair."""
        for name in ("short_factor", "long_factor"):
            values = getattr(self, name)
            if values and len(values) != rotary_dim // 2:
                raise ValueError(
                    f"{self.kind} RoPE scaling: {name} holds {len(values)} numbers, the rotated "
                    f"width {rotary_dim} needs {rotary_dim // 2}"
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


def yarn_scaled_frequencies(head_dim: int, base: float, scaling: RopeScaling) -> Tensor:
    """YaRN: dimensions that turn fewer than beta_slow times over the original length are
    interpolated (/ factor), those that turn more than beta_fast times kept, a linear ramp over
    the dimension index between (its ends rounded outwards when `truncate`)."""
    assert scaling.original_max_positions is not None  # checked by RopeScaling
    inv_freq = rope_frequencies(head_dim, base)

    def dimension(rotations: float) -> float:  # the dimension index that turns `rotations` times
        turns = scaling.original_max_positions / (rotations * 2 * math.pi)  # type: ignore[operator]
        return head_dim * math.log(turns) / (2 * math.log(base))

    low, high = dimension(scaling.beta_fast), dimension(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    return inv_freq / scaling.factor * (1 - keep) + inv_freq * keep


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
    head_dim: int, base: float = 10000.0, scaling: RopeScaling | None = None, *, long: bool = False
) -> Tensor:
    """(D/2,) inverse frequencies after `scaling` (None: plain RoPE). For "dynamic", those of
    sequences up to the trained length, i.e. plain RoPE; for "longrope", the short factors'
    (`long=True`: the long ones')."""
    if scaling is None or scaling.kind == "dynamic":
        return rope_frequencies(head_dim, base)
    if scaling.kind == "yarn":
        return yarn_scaled_frequencies(head_dim, base, scaling)
    inv_freq = rope_frequencies(head_dim, base)
    scaling.check_width(head_dim)
    if scaling.kind in ("longrope", "factors"):
        use_long = long and scaling.kind == "longrope"
        divisors = scaling.long_factor if use_long else scaling.short_factor
        return inv_freq / torch.tensor(divisors, dtype=torch.float64)
    if scaling.kind == "linear":
        return linear_scaled_frequencies(inv_freq, scaling.factor)
    return llama3_scaled_frequencies(inv_freq, scaling)
