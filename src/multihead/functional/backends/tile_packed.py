"""q, k and v as column views of one fused projection, for the tiled backend's gradients.

A module's fused projection (B, T, W) becomes q, k, v by a view, a transpose and a split:
heads-first views (B, H, T, D) of column ranges of one tensor. Given those views as inputs, an
autograd.Function hands back dq, dk, dv separately and autograd assembles the projection's
gradient itself: split's backward concatenates the three (B, H, T, D) gradients and the view's
backward copies the result into (B, T, W) order, two passes over 3 B T H D elements (measured,
module window 256 at T 4096: ~10 ms of a ~330 ms step). Taking the projection itself as the
Function's input, the backward writes dq, dk and dv straight into its one gradient.

Shapes: base (B, T, W) in memory (contiguous, any shape); q (B, H, T, D), k (B, Hkv, T, D),
v (B, Hkv, T, Dv), each with strides (T W, D, W, 1) at its own column offset; or, projected
in blocks (`modules.blocked_projection`), each a whole (B, T, w) block of the base, strides
(T w, D, w, 1) at its own element offset.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
from torch import Tensor


class ViewSpec(NamedTuple):
    """One view of the base (or of a tensor of its layout): size, stride and its storage
    offset relative to the base's."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class PackedViews(NamedTuple):
    base: Tensor  # (B, T, W) in memory, of any shape (e.g. (B T, W))
    views: tuple[ViewSpec, ViewSpec, ViewSpec]  # q, k, v
    covers: bool  # the three column ranges cover every column (else the rest's gradient is 0)


def _plain_view(t: Tensor) -> bool:
    """A view whose gradient reaches its base (it has a grad_fn: a view taken under no_grad
    is a leaf that passes none on) and that nothing else observes: no tensor hook on it and
    no retained gradient (the Function's input is the base, so the view itself is not on the
    gradient's path)."""
    return t.grad_fn is not None and not t._backward_hooks and not t.retains_grad


def packed_views(q: Tensor, k: Tensor, v: Tensor) -> PackedViews | None:
    """The fused tensor q, k and v are disjoint heads-first views of, when they are (and
    gradients are wanted for it), else None. Sizes and strides only: no data is read.
    (The base is whatever tensor the views were taken of: F.linear's output on a (B, T, C)
    input is a view of a (B T, W) matrix, which is then the base.) Two layouts: column
    ranges of one (B, T, W) projection, or blocks, each view a whole (B, T, w) block of its
    own (`modules.blocked_projection`)."""
    base = q._base
    if base is None or k._base is not base or v._base is not base:
        return None
    if not (torch.is_grad_enabled() and base.requires_grad) or not base.is_contiguous():
        return None
    B, _, T, _ = q.shape
    for t in (q, k, v):
        if t.dim() != 4 or t.shape[0] != B or t.shape[2] != T or not _plain_view(t):
            return None
    if all(t.stride(2) == t.shape[1] * t.shape[3] for t in (q, k, v)):
        found = _blocks(base, (q, k, v), B, T)
        if found is not None:
            return found
    return _columns(base, (q, k, v), B, T)


def _offset(t: Tensor, base: Tensor) -> int:
    # (eager only: the tiled backend steps aside under tracing, so offsets are plain ints)
    return int(t.storage_offset() - base.storage_offset())


def _columns(base: Tensor, qkv, B: int, T: int) -> PackedViews | None:
    """Views of column ranges of one (B, T, W) projection: strides (T W, D, W, 1)."""
    W = qkv[0].stride(2)  # a row of the fused projection: (B, T, W) in memory
    if base.numel() != B * T * W:
        return None
    ranges, views = [], []
    for t in qkv:
        width = t.shape[1] * t.shape[3]
        if t.stride() != (T * W, t.shape[3], W, 1):
            return None
        start = _offset(t, base)
        if start < 0 or start + width > W:
            return None
        ranges.append((start, start + width))
        views.append(ViewSpec(tuple(t.shape), t.stride(), start))
    return _disjoint(base, ranges, views, W)


def _blocks(base: Tensor, qkv, B: int, T: int) -> PackedViews | None:
    """Views of whole blocks of the base, each (B, T, w) in memory: strides (T w, D, w, 1)."""
    ranges, views = [], []
    for t in qkv:
        width = t.shape[1] * t.shape[3]
        if t.stride() != (T * width, t.shape[3], width, 1):
            return None
        start = _offset(t, base)
        if start < 0 or start + B * T * width > base.numel():
            return None
        ranges.append((start, start + B * T * width))
        views.append(ViewSpec(tuple(t.shape), t.stride(), start))
    return _disjoint(base, ranges, views, base.numel())


def _disjoint(base: Tensor, ranges: list, views: list, end: int) -> PackedViews | None:
    """The views, unless their ranges (columns, or elements of the base) overlap; `covers`
    when they tile 0 .. end."""
    ranges.sort()
    if any(a[1] > b[0] for a, b in itertools.pairwise(ranges)):
        return None  # overlapping views (q is k): their gradients would have to be added
    covers = (
        ranges[0][0] == 0
        and ranges[-1][1] == end
        and all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    )
    return PackedViews(base, tuple(views), covers)


def take_views(base: Tensor, views) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (or their gradients) as views of base (or of a contiguous tensor of its
    shape)."""
    start = base.storage_offset()
    q, k, v = (base.as_strided(s.size, s.stride, start + s.offset) for s in views)
    return q, k, v
