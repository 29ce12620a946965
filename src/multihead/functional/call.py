"""The validated description of one attention call, shared by every backend, and the one
constructor that builds it (`make_call`).

Shape legend: B batch, H query heads, Hkv key/value heads, Tq queries, Tk keys,
D query/key head width, Dv value head width.

Every attention in multihead (the `attention()` function, `MultiHeadAttention`, the drop-ins,
packed sequences) is built here, so there is one validation policy. Callers that shaped q, k and
v themselves pass `qkv_checked=True` to skip only that part; masks, bias, flags, scale and
dropout are checked the same way for everyone. Checks read shapes, dtypes and devices, never
tensor values, so the constructor is traceable (torch.compile, torch.export).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from .mask_mod import MaskMod, check_mask_mod, mod_mask
from .structure import Structure, check_structure, dense_mask

ScaleRule = Literal["positive", "finite"]


class AttentionCall(NamedTuple):
    """Everything a backend needs, already checked.

    q `(B, H, Tq, D)`, k `(B, Hkv, Tk, D)`, v `(B, Hkv, Tk, Dv)`; `mask` is boolean
    (True = may attend) and `bias` additive, both 4-D and broadcastable to `(B, H, Tq, Tk)`.
    `causal` is aligned bottom-right. `scale` is resolved to a float. `structure` (a window,
    document ids, a prefix; see `functional.structure`) restricts the pairs further; backends
    that do not declare `structured=True` never see it (`dispatch` gives them `dense_call`).
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
    structure: Structure | None = None
    # q, k, v are views of one projection that only their maker holds (a module's own, no
    # hook shown them): a backend may write their gradients into that projection's buffer
    # directly, past the views (the tiled backend does). Never set for views a caller made:
    # a hook or retained gradient on any view between the projection and q, k, v would be
    # skipped, and autograd cannot show them.
    own_views: bool = False
    # Attention variants (see `attention()`): logit soft-capping `tanh(s / c) * c` of the scaled
    # scores, before bias and masking (Gemma 2); per-head sink logits (H,) that join each row's
    # softmax as one more column and bring no value (gpt-oss). Backends that cannot apply them
    # say so in why_not (`variant_reasons`).
    softcap: float | None = None
    sinks: Tensor | None = None

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1 for plain multi-head attention)."""
        return self.q.shape[1] // self.k.shape[1]


def default_scale(head_dim: int) -> float:
    """The one place the default scale lives: `1 / sqrt(head_dim)` (1.0 for empty heads)."""
    return head_dim**-0.5 if head_dim > 0 else 1.0


def shape_str(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _check_tensor(name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(
            f"{name} must have 4 dimensions (B, heads, T, head_dim), got shape {shape_str(t)}"
        )
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


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
        raise ValueError(
            f"batch sizes differ: q {shape_str(q)}, k {shape_str(k)}, v {shape_str(v)}"
        )
    if Dk != D:
        raise ValueError(f"head_dim of q {shape_str(q)} and k {shape_str(k)} differ ({D} != {Dk})")
    if Hkv != Hv or Tk != Tv:
        raise ValueError(
            f"k {shape_str(k)} and v {shape_str(v)} must agree in heads and length (dims 1 and 2)"
        )
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(
            f"key/value heads ({Hkv}, k {shape_str(k)}) must divide query heads "
            f"({H}, q {shape_str(q)})"
        )
    raise AssertionError("unreachable: the combined check failed but no rule did")


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv): one dtype and device, Hkv | H.

    The common case runs one combined test; only a failing input pays for the detailed one.
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
    B, H, _, D = q.shape
    Bk, Hkv, Tk, Dk = k.shape
    Bv, Hv, Tv, _ = v.shape
    if not (
        q.dtype == k.dtype == v.dtype
        and q.dtype.is_floating_point
        and q.device == k.device == v.device
        and B == Bk == Bv
        and D == Dk
        and Hkv == Hv
        and Tk == Tv
        and Hkv > 0
        and H % Hkv == 0
    ):
        _explain_qkv(q, k, v)


def _as_4d(name: str, t: Tensor, target: tuple[int, int, int, int]) -> Tensor:
    """`t` broadcastable to `target` = (B, H, Tq, Tk), as a 4-D view (leading 1s added), so every
    backend sees one rank: `(Tk,)`, `(Tq, Tk)` and 0-d masks broadcast like any other."""
    if t.dim() > 4:
        raise ValueError(
            f"{name} of shape {shape_str(t)} has more than 4 dimensions; it must broadcast to "
            f"(B, H, Tq, Tk) = {target}"
        )
    # Right-aligned broadcasting: every trailing size equals the target or is 1.
    for got, want in zip(reversed(t.shape), reversed(target[4 - t.dim() :]), strict=True):
        if got != want and got != 1:
            raise ValueError(
                f"{name} of shape {shape_str(t)} does not broadcast to (B, H, Tq, Tk) = {target}"
            )
    return t if t.dim() == 4 else t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


def check_mask(mask: object, target: tuple[int, int, int, int], device: torch.device) -> Tensor:
    """A boolean mask (True = may attend) broadcastable to `target` = (B, H, Tq, Tk) -> 4-D."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean (True = may attend), got dtype {mask.dtype}; "
            "pass additive float masks as bias="
        )
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device} but the inputs are on {device}")
    return _as_4d("mask", mask, target)


def check_bias(bias: object, target: tuple[int, int, int, int], device: torch.device) -> Tensor:
    """A float bias (added to the scores) broadcastable to `target` = (B, H, Tq, Tk) -> 4-D."""
    if not isinstance(bias, Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if not bias.is_floating_point():
        raise TypeError(
            f"bias must be a floating-point tensor (added to the scores), got {bias.dtype}; "
            "pass boolean masks as mask="
        )
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device} but the inputs are on {device}")
    return _as_4d("bias", bias, target)


def check_flag(name: str, value: object) -> bool:
    """A Python bool: `causal="no"` or a tensor must not be read as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def resolve_scale(scale: object, head_dim: int, rule: ScaleRule = "positive") -> float:
    """`None` -> the default `1 / sqrt(head_dim)`; otherwise a real number that is finite and,
    under the default rule, positive. The SDPA drop-in uses `rule="finite"`: torch accepts zero
    and negative scales, and so must an exact drop-in."""
    if scale is None:
        return default_scale(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale) or (rule == "positive" and scale <= 0):
        want = "finite and positive" if rule == "positive" else "finite"
        raise ValueError(f"scale must be {want}, got {scale}")
    return float(scale)


def check_softcap(softcap: object) -> float | None:
    """None, or a finite positive float: the scores become `tanh(s / softcap) * softcap`."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float or None, got {type(softcap).__name__}")
    if not math.isfinite(softcap) or softcap <= 0:
        raise ValueError(f"softcap must be finite and positive, got {softcap}")
    return float(softcap)


def check_sinks(sinks: object, q: Tensor) -> Tensor:
    """Per-head sink logits: a floating (H,) tensor on q's device (H = query heads)."""
    if not isinstance(sinks, Tensor):
        raise TypeError(f"sinks must be a torch.Tensor or None, got {type(sinks).__name__}")
    if not sinks.is_floating_point():
        raise TypeError(f"sinks must be a floating-point tensor, got dtype {sinks.dtype}")
    if sinks.shape != (q.shape[1],):
        raise ValueError(
            f"sinks must have shape (H,) = ({q.shape[1]},), one logit per query head of "
            f"q {shape_str(q)}; got {shape_str(sinks)}"
        )
    if sinks.device != q.device:
        raise ValueError(f"sinks is on {sinks.device} but the inputs are on {q.device}")
    return sinks


def variant_reasons(call: AttentionCall, what: str) -> list[str]:
    """The why_not lines of a backend that applies neither soft-capping nor sinks (`what`
    names the kernel): empty for calls without them."""
    reasons = []
    if call.softcap is not None:
        reasons.append(f"{what} has no logit soft-capping (softcap=; the eager backend has)")
    if call.sinks is not None:
        reasons.append(f"{what} has no sink logits (sinks=; the eager backend has)")
    return reasons


def check_dropout(dropout_p: object, name: str = "dropout_p") -> float:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {dropout_p}")
    return float(dropout_p)


def make_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    window: int | tuple[int, int] | None = None,
    documents: Tensor | None = None,
    prefix: int | Tensor | None = None,
    mask_mod: MaskMod | None = None,
    block_size: int | tuple[int, int] | None = None,
    qkv_checked: bool = False,
    scale_rule: ScaleRule = "positive",
    own_views: bool = False,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    variants_checked: bool = False,
) -> AttentionCall:
    """Validate an attention call once, with errors that name the argument and its shape.

    `qkv_checked=True`: the caller shaped q, k and v itself (a module after its projections),
    so their mutual consistency holds by construction and is not re-tested. `own_views=True`:
    see `AttentionCall.own_views` (a module's projections that no hook has seen).
    `variants_checked=True`: `scale` and `softcap` were checked when the caller was built (a
    module's own; re-checking a float under torch.compile(dynamic=True) would break the graph).
    """
    if not qkv_checked:
        check_qkv(q, k, v)
    # (the common call, no mask, bias or structure, reads no shape but D: each read costs)
    if mask is not None or bias is not None:
        target = (*q.shape[:3], k.shape[2])
        if mask is not None:
            mask = check_mask(mask, target, q.device)
        if bias is not None:
            bias = check_bias(bias, target, q.device)
    if causal is not True and causal is not False:  # (identity tests: the common case is free)
        check_flag("causal", causal)
    structure = None
    if window is not None or documents is not None or prefix is not None:
        structure = check_structure(
            window, documents, prefix, causal=causal, batch=q.shape[0], tq=q.shape[2],
            tk=k.shape[2], device=q.device,
        )  # fmt: skip
    if mask_mod is not None or block_size is not None:
        fn, block = check_mask_mod(mask_mod, block_size, q.shape[2], k.shape[2], *q.shape[:2])
        structure = (structure or Structure())._replace(mask_mod=fn, block=block)
    if return_weights is not True and return_weights is not False:
        check_flag("return_weights", return_weights)
    if type(dropout_p) is not float or dropout_p != 0.0:
        dropout_p = check_dropout(dropout_p)
    if softcap is not None and not variants_checked:
        softcap = check_softcap(softcap)
    if sinks is not None:
        sinks = check_sinks(sinks, q)
    D = q.shape[3]
    return AttentionCall(
        q, k, v, mask, bias, causal,
        default_scale(D) if scale is None
        else scale if variants_checked else resolve_scale(scale, D, scale_rule), dropout_p,
        return_weights, structure, own_views, softcap, sinks,
    )  # fmt: skip


def dense_call(call: AttentionCall) -> AttentionCall:
    """The same call with its structure folded into a dense boolean mask, for backends that
    cannot read structure. Causality stays a flag unless a prefix relaxes it. A mask_mod is
    evaluated here once on the whole grid: (B or 1, H or 1, Tq, Tk)."""
    structure = call.structure
    if structure is None:
        return call
    (B, H, tq, _), tk = call.q.shape, call.k.shape[2]
    with_prefix = structure.prefix is not None
    dense = dense_mask(structure, call.causal and with_prefix, tq, tk, call.q.device)
    if structure.mask_mod is not None:
        mod = mod_mask(structure.mask_mod, B, H, 0, tq, 0, tk, tq, tk, call.q.device)
        dense = mod if dense is None else dense & mod
    mask = dense if call.mask is None else (call.mask if dense is None else call.mask & dense)
    return call._replace(mask=mask, causal=call.causal and not with_prefix, structure=None)
