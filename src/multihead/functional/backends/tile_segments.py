"""Documents that sit in contiguous runs (packed training sequences): one fused kernel call per
document, causal inside it when the call is, instead of a plan of tiles.

Each row belongs to one document, so a document's calls give that row's final output and
log-sum-exp: no mask, and the backward pass is one kernel backward per call. A causal document
of a few hundred positions runs in chunks (`_chunks`: each chunk causal on its own keys, plus
one call over the keys before it, merged by log-sum-exp), which torch's kernel runs cheaper.
Ids that come back after another document (a document split in two runs) are not contiguous:
the general tile plan serves those calls (`segment_plan` returns None).

Shapes: q (B, H, T, D), k / v (B, Hkv, T, D / Dv) (the kernel reads grouped heads itself);
documents (B, T); out (B, H, T, Dv), lse (B, H, T); a plan lists (b, start, stop) runs.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from ...value_checks import may_read
from ..tiles import merge_into
from .tile_kernel import KERNEL_DTYPES

Segment = tuple[int, int, int]  # (batch row, first position, one past the last)


def segment_plan(structure, mask, bias, q: Tensor, k: Tensor) -> list[Segment] | None:
    """Every document's run, when a call has documents alone (no window, prefix, mask_mod,
    mask or bias), square, on the kernel's dtypes, with ids readable for free and each id in
    one run per row."""
    if structure is None or structure.documents is None:
        return None
    if structure.window is not None or structure.prefix is not None:
        return None
    if structure.mask_mod is not None:  # its tiles are classified by evaluating it
        return None
    if mask is not None or bias is not None or q.shape[2] != k.shape[2]:
        return None
    docs = structure.documents
    if q.dtype not in KERNEL_DTYPES or not may_read(docs):
        return None
    T = docs.shape[1]
    change = torch.ones(docs.shape, dtype=torch.bool, device=docs.device)
    change[:, 1:] = docs[:, 1:] != docs[:, :-1]  # (B, T): a run starts here
    segments: list[Segment] = []
    for b, starts in enumerate(change.tolist()):
        first = [i for i, s in enumerate(starts) if s]
        ids = docs[b, first].tolist()
        if len(set(ids)) != len(ids):
            return None  # a document in two runs
        segments.extend((b, s, e) for s, e in zip(first, [*first[1:], T], strict=True))
    return segments


def _chunks(s: int, e: int, causal: bool) -> list[int]:
    """Where a document's rows are cut: a causal document of 256 to 2047 positions runs as
    causal chunks of 128 (below 512) or 256, each also attending to the keys before it in one
    call without causality. Why: torch's CPU kernel pays about 2x the pairs on a causal call
    of a few hundred positions (its blocks run whole), so the cut is cheaper (measured,
    forward + backward, one thread, 8 heads: 512 positions 131 -> 107 ms, 1024 positions
    192 -> 171 ms, 2048 no gain)."""
    n = e - s
    if not causal or n < 256 or n >= 2048:
        return [s, e]
    size = 128 if n < 512 else 256
    return [*range(s, e, size), e]


def segments_forward(q, k, v, segments, causal: bool, scale: float, out, lse) -> None:
    """Write out (B, H, T, Dv) and lse (B, H, T) document by document."""
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    for b, s, e in segments:
        cuts = _chunks(s, e, causal)
        for c0, c1 in itertools.pairwise(cuts):
            rows = (slice(b, b + 1), slice(None), slice(c0, c1))
            o, l = kernel(q[rows], k[rows], v[rows], is_causal=causal, scale=scale)
            if c0 > s:  # the keys of the document before this chunk: every pair allowed
                before = (slice(b, b + 1), slice(None), slice(s, c0))
                o2, l2 = kernel(q[rows], k[before], v[before], scale=scale)
                o, l = o.contiguous(), l.contiguous()
                merge_into(o, l, o2, l2)
            out[rows] = o
            lse[rows] = l


def segments_backward(q, k, v, grad_out, out, lse, segments, causal, scale, dq, dk, dv) -> None:
    """Write dq (B, H, T, D), dk, dv (B, Hkv, T, D) document by document (each position is in
    one document: its gradients come from that document's calls alone). Chunks run in order:
    each writes its own rows and keys, then adds to the keys before it, written already."""
    out = out.to(q.dtype)
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    for b, s, e in segments:
        cuts = _chunks(s, e, causal)
        for c0, c1 in itertools.pairwise(cuts):
            r = (slice(b, b + 1), slice(None), slice(c0, c1))
            g, o, l = grad_out[r], out[r], lse[r].to(q.dtype)
            dq[r], dk[r], dv[r] = kernel(g, q[r], k[r], v[r], o, l, 0.0, causal, scale=scale)
            if c0 > s:
                before = (slice(b, b + 1), slice(None), slice(s, c0))
                dq_t, dk_t, dv_t = kernel(
                    g, q[r], k[before], v[before], o, l, 0.0, False, scale=scale
                )
                dq[r] += dq_t
                dk[before] += dk_t
                dv[before] += dv_t
