"""Rotary position embeddings (RoPE, Su et al. 2021): pure functions, and a module that computes
cos/sin from each call's positions.

Convention: the "rotate half" layout of GPT-NeoX / LLaMA: dimension i pairs with i + D/2.
Shapes: x (B, H, T, D); positions (T,) or (B, T); cos/sin broadcast to x; inverse frequencies
(D/2,).

Scaling (how checkpoints stretch RoPE past their training length, as Hugging Face's
`rope_scaling` types): see rope_scaling.py. Partial rotary (GPT-NeoX's rotary_pct, Phi's
partial_rotary_factor): only the first `rotary_dim` values of each head rotate, the rest pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

from .rope_scaling import (
    SCALING_KINDS,
    RopeScaling,
    _check_head_dim,
    _finite_number,
    dynamic_ntk_frequencies,
    linear_scaled_frequencies,
    llama3_scaled_frequencies,
    rope_frequencies,
    scaled_rope_frequencies,
    yarn_scaled_frequencies,
)
from .scheme import PositionScheme

__all__ = [
    "SCALING_KINDS",
    "RopeScaling",
    "RotaryEmbedding",
    "apply_rope",
    "dynamic_ntk_frequencies",
    "linear_scaled_frequencies",
    "llama3_scaled_frequencies",
    "rope_cos_sin",
    "rope_frequencies",
    "scaled_rope_frequencies",
    "yarn_scaled_frequencies",
]


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


def _rotated(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """`apply_rope` with the sign of rotate_half folded into the sin table: the halves of x
    swapped (one flip) instead of split, negated and joined. x (..., D); tables broadcast."""
    D = x.shape[-1]
    swapped = x.unflatten(-1, (2, D // 2)).flip(-2).flatten(-2)  # (..., D): x2 then x1
    return x * cos + swapped * signed_sin


# cos/sin tables shared by the layers of one forward (`RotaryEmbedding.shared_cos_sin`), keyed
# by (module, positions tensor, dtype); None outside such a block. A context variable: each
# thread (and asyncio task) sees only its own forward's tables.
_SHARED: ContextVar[dict[tuple[int, int, torch.dtype], tuple[Tensor, Tensor, Tensor]] | None] = (
    ContextVar("multihead_shared_rope_tables", default=None)
)


class RotaryEmbedding(PositionScheme):
    """Rotates q and k by their positions. cos/sin are computed from the positions on every call
    (fp32 angles, as Hugging Face and torchtitan do): no table to outgrow, nothing read from
    tensor values, so it traces; negative positions are refused by the module's input checks.

    `scaling`: a `RopeScaling`. "linear", "llama3", "yarn" and "factors" change the frequencies
    once; "dynamic" computes them per call from the call's largest position, and "longrope"
    picks its short or long factors from it (as Hugging Face does), so keys cached while
    decoding keep the rotation they were computed with. "yarn" and "longrope" also multiply
    cos/sin by their attention factor.
    `rotary_dim`: how many leading values of each head rotate (default all of `head_dim`; an
    even number); the others pass unchanged (GPT-NeoX's partial rotary).
    """

    uses_positions = True
    rotates_heads = True

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        max_positions: int = 2048,
        scaling: RopeScaling | None = None,
        rotary_dim: int | None = None,
    ) -> None:
        """`max_positions` is kept for compatibility; nothing is preallocated any more."""
        super().__init__()
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be a RopeScaling or None, got {type(scaling).__name__}")
        if not _finite_number(base) or base <= 1:
            raise ValueError(f"RoPE base must be a number > 1, got {base!r}")
        _check_head_dim(head_dim)
        rotary = head_dim if rotary_dim is None else rotary_dim
        if (
            isinstance(rotary, bool)
            or not isinstance(rotary, int)
            or not 0 < rotary <= head_dim
            or rotary % 2
        ):
            raise ValueError(
                f"rotary_dim must be an even int in 2 .. head_dim {head_dim}, got {rotary_dim!r}"
            )
        self.head_dim, self.base, self.scaling, self.rotary_dim = head_dim, base, scaling, rotary
        self.attention_scale = 1.0 if scaling is None else scaling.attention_scale
        self.inv_freq: Tensor
        inv_freq = scaled_rope_frequencies(rotary, base, scaling)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.long_inv_freq: Tensor | None
        long = None
        if scaling is not None and scaling.kind == "longrope":
            long = scaled_rope_frequencies(rotary, base, scaling, long=True).float()
        self.register_buffer("long_inv_freq", long, persistent=False)

    @contextmanager
    def shared_cos_sin(self) -> Iterator[None]:
        """Inside: cos/sin are computed once per positions tensor (by identity) and dtype, and
        reused by the layers that share this module (a decoder's forward passes every layer
        the same positions). Eager only (compiled code computes them as traced). The memo
        lives in the caller's context (a context variable), not on the module: two threads
        running one model each have their own, and it ends with the block, so a tensor
        changed in place after it is never read stale."""
        token = _SHARED.set({}) if _SHARED.get() is None else None
        try:
            yield
        finally:
            if token is not None:
                _SHARED.reset(token)

    @property
    def dynamic(self) -> bool:
        return self.scaling is not None and self.scaling.kind == "dynamic"

    def extra_repr(self) -> str:
        partial = "" if self.rotary_dim == self.head_dim else f", rotary_dim={self.rotary_dim}"
        return f"head_dim={self.head_dim}, base={self.base}, scaling={self.scaling}{partial}"

    def check(self, num_heads: int, head_dim: int) -> None:
        if head_dim != self.head_dim:
            raise ValueError(
                f"RotaryEmbedding head_dim {self.head_dim} != the attention's head_dim {head_dim}"
            )

    def frequencies(self, positions: Tensor) -> Tensor:
        """(rotary_dim/2,) inverse frequencies this call's positions rotate by."""
        inv_freq = self.inv_freq
        if self.scaling is None or not positions.numel():
            return inv_freq
        seq_len = positions.max() + 1  # a 0-d tensor: no host sync
        if self.dynamic:
            inv_freq = dynamic_ntk_frequencies(self.rotary_dim, self.base, self.scaling, seq_len)
        elif self.long_inv_freq is not None:
            original = self.scaling.original_max_positions
            assert original is not None  # checked by RopeScaling
            inv_freq = torch.where(seq_len > original, self.long_inv_freq, inv_freq)
        return inv_freq

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin of shape (*positions.shape, rotary_dim), times the attention factor."""
        return self._cos_sin(positions, dtype)

    def _tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and the signed sin (-sin on the first half, sin on the second) that `rotate`
        multiplies by: x cos + swap_halves(x) signed_sin is x cos + rotate_half(x) sin exactly
        (a sign flip rounds nothing). Inside `shared_cos_sin`, made once per positions tensor."""
        if torch.compiler.is_compiling():  # (traced: the compiler shares what repeats)
            return self._signed(positions, dtype)
        memo = _SHARED.get()
        if memo is not None:
            key = (id(self), id(positions), dtype)
            hit = memo.get(key)  # (the entry holds positions: its id is not reused meanwhile)
            if hit is not None and hit[0] is positions:
                return hit[1], hit[2]
            cos, signed = self._signed(positions, dtype)
            memo[key] = (positions, cos, signed)
            return cos, signed
        return self._signed(positions, dtype)

    def _signed(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        cos, sin = self._cos_sin(positions, dtype)
        half = sin.shape[-1] // 2
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)

    def _cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        inv_freq = self.frequencies(positions)
        angles = positions.float()[..., None] * inv_freq.float().to(positions.device)  # (..., D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (..., D)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_scale != 1.0:
            cos, sin = cos * self.attention_scale, sin * self.attention_scale
        return cos.to(dtype), sin.to(dtype)

    def _head_tables(self, heads: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """`_tables` for heads (B, n, T, D), after checking their D: broadcastable over the
        heads ((T, D), or (B, 1, T, D) for per-row positions)."""
        if heads.shape[-1] != self.head_dim:
            raise ValueError(
                f"q head_dim {heads.shape[-1]} != RotaryEmbedding head_dim {self.head_dim}"
            )
        cos, signed = self._tables(positions, heads.dtype)
        if cos.dim() == 3:  # per-row positions: (B, T, D) -> (B, 1, T, D)
            cos, signed = cos[:, None], signed[:, None]
        return cos, signed

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, T, D), k (B, Hkv, T, D); positions (T,) or (B, T) of those T tokens."""
        cos, signed = self._head_tables(q, positions)
        r = self.rotary_dim
        if r == self.head_dim:
            return _rotated(q, cos, signed), _rotated(k, cos, signed)
        # (B, H, T, D) -> rotated (..., :r) and passed (..., r:) parts
        return (
            torch.cat([_rotated(q[..., :r], cos, signed), q[..., r:]], dim=-1),
            torch.cat([_rotated(k[..., :r], cos, signed), k[..., r:]], dim=-1),
        )

    def has_tables(self, positions: Tensor, dtype: torch.dtype) -> bool:
        """Whether this forward's shared tables (`shared_cos_sin`) hold `positions` already:
        an earlier layer rotated by this very tensor (and its caller checked it). Traced:
        False (the tables are not shared there, and dynamo cannot read a context variable)."""
        if torch.compiler.is_compiling():
            return False
        memo = _SHARED.get()
        if memo is None:
            return False
        hit = memo.get((id(self), id(positions), dtype))
        return hit is not None and hit[0] is positions

    def rotate_heads_(self, heads: Tensor, count: int, positions: Tensor) -> None:
        """`rotate` for the first `count` heads of heads (B, n, T, D), in place: a fused
        projection's query heads then key heads, rotated in one pass (the same formula and
        values as `rotate`, which rotates q and k apart). heads must not need a gradient."""
        cos, signed = self._head_tables(heads, positions)
        x = heads[:, :count]  # (B, count, T, D)
        if self.rotary_dim != self.head_dim:
            x = x[..., : self.rotary_dim]
        D = x.shape[-1]
        swapped = x.unflatten(-1, (2, D // 2)).flip(-2).flatten(-2)  # (a copy: read before x)
        if x.requires_grad and torch.is_grad_enabled():  # (out= does not record a gradient)
            x.copy_(x * cos + swapped * signed)
        else:
            torch.add(x * cos, swapped * signed, out=x)

    def forward(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.rotate(q, k, positions)
