"""The validated description of one attention call, shared by every backend.

Shape legend: B batch, H query heads, Hkv key/value heads, Tq queries, Tk keys,
D query/key head width, Dv value head width.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class AttentionCall(NamedTuple):
    """Everything a backend needs, already checked.

    q `(B, H, Tq, D)`, k `(B, Hkv, Tk, D)`, v `(B, Hkv, Tk, Dv)`; `mask` is boolean
    (True = may attend) and `bias` additive, both broadcastable to `(B, H, Tq, Tk)`.
    `causal` is aligned bottom-right. `scale` is resolved to a float.
    (A NamedTuple: built on every call, it must be cheap; dynamo traces it without breaks.)
    """

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    bias: Tensor | None
    causal: bool
    scale: float
    dropout_p: float
    return_weights: bool

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1 for plain multi-head attention)."""
        return self.q.shape[1] // self.k.shape[1]


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _check_tensor(name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(
            f"{name} must have 4 dimensions (B, heads, T, head_dim), got shape {_shape(t)}"
        )
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def _check_broadcast(name: str, t: Tensor, target: tuple[int, ...]) -> None:
    if t.dim() > 4:
        raise ValueError(
            f"{name} of shape {_shape(t)} has more than 4 dimensions; it must broadcast to "
            f"(B, H, Tq, Tk) = {target}"
        )
    # Right-aligned broadcasting: every trailing size equals the target or is 1.
    for got, want in zip(
        reversed(t.shape), reversed(target[-t.dim() :] if t.dim() else ()), strict=True
    ):
        if got != want and got != 1:
            raise ValueError(
                f"{name} of shape {_shape(t)} does not broadcast to (B, H, Tq, Tk) = {target}"
            )


def check_mask(mask: object, target: tuple[int, ...], device: torch.device) -> None:
    """A boolean mask (True = may attend) that broadcasts to `target` = (B, H, Tq, Tk)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean (True = may attend), got dtype {mask.dtype}; "
            "pass additive float masks as bias="
        )
    _check_broadcast("mask", mask, target)
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device} but the inputs are on {device}")


def check_bias(bias: object, target: tuple[int, ...], device: torch.device) -> None:
    """A float bias (added to the scores) that broadcasts to `target` = (B, H, Tq, Tk)."""
    if not isinstance(bias, Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if not bias.is_floating_point():
        raise TypeError(
            f"bias must be a floating-point tensor (added to the scores), got {bias.dtype}; "
            "pass boolean masks as mask="
        )
    _check_broadcast("bias", bias, target)
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device} but the inputs are on {device}")


def _explain_qkv(q: object, k: object, v: object) -> None:
    """Raise the precise error for q, k, v that failed the combined check."""
    q, k, v = _check_tensor("q", q), _check_tensor("k", k), _check_tensor("v", v)
    B, H, _, D = q.shape
    Bk, Hkv, Tk, Dk = k.shape
    Bv, Hv, Tv, _ = v.shape
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (B == Bk == Bv):
        raise ValueError(f"batch sizes differ: q {_shape(q)}, k {_shape(k)}, v {_shape(v)}")
    if Dk != D:
        raise ValueError(f"head_dim of q {_shape(q)} and k {_shape(k)} differ ({D} != {Dk})")
    if Hkv != Hv or Tk != Tv:
        raise ValueError(
            f"k {_shape(k)} and v {_shape(v)} must agree in heads and length (dims 1 and 2)"
        )
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(
            f"key/value heads ({Hkv}, k {_shape(k)}) must divide query heads ({H}, q {_shape(q)})"
        )
    raise AssertionError("unreachable: the combined check failed but no rule did")


def make_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    causal: bool,
    scale: float | None,
    dropout_p: float,
    return_weights: bool,
) -> AttentionCall:
    """Validate public inputs once, with errors that name the argument and its shape.

    The common case runs one combined check; only a failing input pays for the detailed one.
    """
    if not (
        isinstance(q, Tensor)
        and isinstance(k, Tensor)
        and isinstance(v, Tensor)
        and q.dim() == 4
        and k.dim() == 4
        and v.dim() == 4
    ):
        _explain_qkv(q, k, v)
    B, H, Tq, D = q.shape
    Bk, Hkv, Tk, Dk = k.shape
    Bv, Hv, Tv, _ = v.shape
    dtype, device = q.dtype, q.device
    if not (
        dtype == k.dtype == v.dtype
        and dtype.is_floating_point
        and device == k.device == v.device
        and B == Bk == Bv
        and D == Dk
        and Hkv == Hv
        and Tk == Tv
        and Hkv > 0
        and H % Hkv == 0
    ):
        _explain_qkv(q, k, v)
    target = (B, H, Tq, Tk)
    if mask is not None:
        check_mask(mask, target, device)
    if bias is not None:
        check_bias(bias, target, device)
    if scale is None:
        scale = D**-0.5 if D > 0 else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    elif not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be finite and positive, got {scale}")
    if dropout_p != 0.0:  # 0.0 (the usual value) needs no further check
        if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
            raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
        if not 0.0 <= dropout_p < 1.0:
            raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return AttentionCall(
        q, k, v, mask, bias, bool(causal), float(scale), float(dropout_p), bool(return_weights)
    )
