"""Validation for `ring_attention`: each rank checks its own inputs, then all ranks compare what
must agree across the ring, in one small all-gather.

A rank whose inputs are bad does not raise at once (its peers would wait for it forever): it
joins the all-gather with an error flag, and then every rank raises, so a bad input fails the
whole ring with a clear error instead of hanging it.

Shapes: q (B, H, T_r, D), k (B, Hkv, T_r, D), v (B, Hkv, T_r, Dv), key_mask (B, T_r).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor

from ..functional.dropout_mask import check_seed
from ..functional.structure import check_document_ids, check_window
from .input_agreement import DEFAULT_TIMEOUT, all_gather_within
from .layout import LAYOUTS, Segment, check_layout, segments_from_lengths
from .ring import Ring

BiasFn = Callable[[Tensor, Tensor], Tensor]
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class RingSetup:
    """Everything both rings need, checked and agreed on by every rank."""

    ring: Ring
    segments: list[list[Segment]]  # [group rank] -> that rank's segments
    causal: bool
    scale: float
    dropout_p: float
    dropout_seed: int
    bias_fn: BiasFn | None
    block_size: int
    window: tuple[int, int] | None = None  # (left, right) keys each side, global positions
    documents: bool = False  # document ids travel round the ring with the keys


def _shape(t: Tensor) -> str:
    return str(tuple(t.shape))


def check_group(group: object) -> Ring:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "ring_attention needs torch.distributed: call torch.distributed.init_process_group "
            "first (for example under torchrun), then pass group= or use the default group"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, got {group!r}")
    if dist.get_rank(group) < 0:
        raise ValueError("this process is not a member of group")
    return Ring(group)


def _check_qkv(q: object, k: object, v: object) -> tuple[Tensor, Tensor, Tensor]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions (B, heads, T/P, head_dim), got {_shape(t)}"
            )
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    assert isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    (B, H, T, D), (Bk, Hkv, Tk, Dk), (Bv, Hv, Tv, _) = q.shape, k.shape, v.shape
    if not B == Bk == Bv:
        raise ValueError(f"batch sizes differ: q {_shape(q)}, k {_shape(k)}, v {_shape(v)}")
    if D != Dk:
        raise ValueError(f"head_dim of q {_shape(q)} and k {_shape(k)} differ ({D} != {Dk})")
    if Hkv != Hv or Tk != Tv:
        raise ValueError(
            f"k {_shape(k)} and v {_shape(v)} must agree in heads and length (dims 1 and 2)"
        )
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(
            f"key/value heads ({Hkv}, k {_shape(k)}) must divide query heads ({H}, q {_shape(q)})"
        )
    if T != Tk:
        raise ValueError(
            f"q {_shape(q)} and k {_shape(k)} must hold the same positions of the sequence "
            f"(dim 2: {T} != {Tk})"
        )
    return q, k, v


def _check_key_mask(key_mask: object, q: Tensor) -> None:
    if key_mask is None:
        return
    if not isinstance(key_mask, Tensor):
        raise TypeError(f"key_mask must be a torch.Tensor or None, got {type(key_mask).__name__}")
    if key_mask.dtype != torch.bool:
        raise TypeError(f"key_mask must be boolean (True = a real key), got dtype {key_mask.dtype}")
    want = (q.shape[0], q.shape[2])
    if tuple(key_mask.shape) != want:
        raise ValueError(
            f"key_mask must have shape (B, T/P) = {want} for q {_shape(q)}, got {_shape(key_mask)}"
        )
    if key_mask.device != q.device:
        raise ValueError(f"key_mask is on {key_mask.device} but q is on {q.device}")


def _check_scale(scale: object, head_dim: int) -> float:
    if scale is None:
        return head_dim**-0.5 if head_dim > 0 else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be finite and positive, got {scale}")
    return float(scale)


def _check_dropout(dropout_p: object, dropout_seed: object) -> tuple[float, int]:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p == 0.0:
        return 0.0, 0 if dropout_seed is None else check_seed(dropout_seed)
    if dropout_seed is None:
        raise ValueError(
            "dropout_p > 0 needs dropout_seed: an int shared by all ranks that fixes the mask "
            "(see multihead.parallel.dropout_keep_mask)"
        )
    return float(dropout_p), check_seed(dropout_seed)


def check_bias(bias: object, target: tuple[int, int, int, int], device: torch.device) -> Tensor:
    """What bias_fn returned for a (tq, tk) tile: float, on `device`, broadcastable to target."""
    if not isinstance(bias, Tensor) or not bias.is_floating_point():
        what = type(bias).__name__ if not isinstance(bias, Tensor) else f"dtype {bias.dtype}"
        raise TypeError(f"bias_fn must return a floating-point tensor, got {what}")
    ok = bias.dim() <= 4 and all(
        got in (1, want) for got, want in zip(reversed(bias.shape), reversed(target), strict=False)
    )
    if not ok:
        raise ValueError(
            f"bias_fn returned shape {_shape(bias)}, which does not broadcast to "
            f"(B, H, tq, tk) = {target}"
        )
    if bias.device != device:
        raise ValueError(f"bias_fn returned a tensor on {bias.device}, but q is on {device}")
    if bias.requires_grad:
        raise ValueError(
            "bias_fn must return a tensor that does not require grad "
            "(ring_attention treats the bias as a constant)"
        )
    return bias


def _probe_bias_fn(bias_fn: object, q: Tensor) -> None:
    if bias_fn is None:
        return
    if not callable(bias_fn):
        raise TypeError(
            f"bias_fn must be callable (q_index, k_index) -> bias, got {type(bias_fn).__name__}"
        )
    q_index = torch.arange(2, device=q.device)
    k_index = torch.arange(3, device=q.device)
    check_bias(bias_fn(q_index, k_index), (q.shape[0], q.shape[1], 2, 3), q.device)


def _check_block_size(block_size: object) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return block_size


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bits_float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


# What every rank must agree on, as (name in errors, how to show a gathered value).
_AGREED: tuple[tuple[str, Callable[[int], object]], ...] = (
    ("batch size B (dim 0 of q, k, v)", int),
    ("query heads H (dim 1 of q)", int),
    ("key/value heads Hkv (dim 1 of k, v)", int),
    ("head_dim D (dim 3 of q, k)", int),
    ("value head_dim Dv (dim 3 of v)", int),
    ("dtype of q, k, v", lambda i: _DTYPES[i]),
    ("causal", bool),
    ("layout", lambda i: LAYOUTS[i]),
    ("key_mask given", bool),
    ("bias_fn given", bool),
    ("scale", _bits_float),
    ("dropout_p", _bits_float),
    ("dropout_seed", int),
    ("documents given", bool),
    ("window left (-1: none)", int),
    ("window right (-1: none)", int),
    ("needs gradients (grad mode and q, k or v requiring grad)", bool),
)


def _comm_device(ring: Ring, q: object) -> torch.device:
    """Where the metadata tensor must live for the group's backend (NCCL: this rank's GPU)."""
    if str(dist.get_backend(ring.group)) != "nccl":
        return torch.device("cpu")
    if isinstance(q, Tensor) and q.device.type == "cuda":
        return q.device
    return torch.device("cuda", torch.cuda.current_device())


def prepare(
    q: object,
    k: object,
    v: object,
    key_mask: object,
    *,
    group: object,
    causal: object,
    scale: object,
    dropout_p: object,
    dropout_seed: object,
    layout: object,
    bias_fn: object,
    block_size: object,
    window: object = None,
    documents: object = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> RingSetup:
    """Check this rank's inputs, agree with the other ranks (within `timeout` seconds), and
    plan the ring."""
    ring = check_group(group)
    error: Exception | None = None
    values = [0] * len(_AGREED)
    length = 0
    try:
        q, k, v = _check_qkv(q, k, v)
        backend = str(dist.get_backend(ring.group))
        if backend == "nccl" and q.device.type != "cuda":
            raise ValueError(
                f"q is on {q.device} but the group's backend is nccl (CUDA tensors only)"
            )
        _check_key_mask(key_mask, q)
        win = None if window is None else check_window(window)
        if documents is not None:
            shape = (q.shape[0], q.shape[2])
            check_document_ids(documents, shape, "(B, T/P)", q.device)
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        scale_f = _check_scale(scale, q.shape[3])
        p, seed = _check_dropout(dropout_p, dropout_seed)
        layout = check_layout(layout)
        tile = _check_block_size(block_size)
        _probe_bias_fn(bias_fn, q)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        B, H, length, D = q.shape
        values = [
            B, H, k.shape[1], D, v.shape[3], _DTYPES.index(q.dtype), int(causal),
            LAYOUTS.index(layout), int(key_mask is not None), int(bias_fn is not None),
            _float_bits(scale_f), _float_bits(p), seed, int(documents is not None),
            -1 if win is None else win[0], -1 if win is None else win[1], int(needs_grad),
        ]  # fmt: skip
    except Exception as exc:  # raised below, after the peers know this rank failed
        error = exc
    row = torch.tensor([int(error is not None), length, *values], dtype=torch.long)
    row = row.to(_comm_device(ring, q))
    rows = all_gather_within(
        row, ring.group, timeout=timeout, where="ring_attention", option="ring_attention"
    )
    table = [r.tolist() for r in rows]  # one host sync per call: shapes and flags only

    failed = [i for i, r in enumerate(table) if r[0]]
    if error is not None:
        raise error
    if failed:
        raise ValueError(
            f"ring_attention: rank(s) {failed} of the group rejected their inputs "
            "(see the error raised there)"
        )
    for i, (name, show) in enumerate(_AGREED):
        seen = [r[2 + i] for r in table]
        if len(set(seen)) > 1:
            by_rank = ", ".join(f"rank {j}: {show(x)}" for j, x in enumerate(seen))
            raise ValueError(
                f"ring_attention: {name} must be the same on every rank, got {by_rank}"
            )
    segments = segments_from_lengths([r[1] for r in table], str(layout))
    checked_bias_fn = cast("BiasFn | None", bias_fn)
    left, right = table[0][2 + len(_AGREED) - 3], table[0][2 + len(_AGREED) - 2]
    return RingSetup(
        ring, segments, bool(causal), scale_f, p, seed, checked_bias_fn, tile,
        None if left < 0 else (left, right), documents is not None,
    )  # fmt: skip
