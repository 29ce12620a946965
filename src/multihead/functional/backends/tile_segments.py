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
from .tile_kernel import KERNEL_DTYPES, run_backward, run_forward, serves_alone

Segment = tuple[int, int, int]  # (batch row, first position, one past the last)


def segment_plan(structure, mask, bias, q: Tensor, k: Tensor) -> list[Segment] | None:
    """Every document's run, when a call has documents alone (no window, prefix, mask_mod,
    mask or bias), square, on the kernel's dtypes, with ids readable for free and each id in
    one run per row."""
    if not serves_alone("documents", structure, mask, bias, q, k):
        return None
    docs = structure.documents
    if not may_read(docs):
        return None
    return segments_of(docs)


def held_segments(ids: Tensor, mask, bias, q: Tensor, k: Tensor) -> list[Segment] | None:
    """The runs of documents recognised in a mask_mod (`functional.mask_documents`: ids
    (B or 1, T), causal inside each), where the call has nothing else to mask (no mask or
    bias), is square and on the kernel's dtypes; None otherwise."""
    if mask is not None or bias is not None:
        return None
    if q.shape[2] != k.shape[2] or q.dtype not in KERNEL_DTYPES or ids.shape[1] != q.shape[2]:
        return None
    return segments_of(ids.expand(q.shape[0], -1))


def segments_of(docs: Tensor) -> list[Segment] | None:
    """(B, T) ids -> every document's run, (b, start, stop); None where an id comes back
    after another (a document in two runs)."""
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
    """Write out (B, H, T, Dv) and lse (B, H, T) document by document, chunk by chunk."""
    for b, s, e in segments:
        row = slice(b, b + 1)
        for c0, c1 in itertools.pairwise(_chunks(s, e, causal)):
            o, l = run_forward(q[row], k[row], v[row], c0, c1, s, causal, scale)
            out[row, :, c0:c1], lse[row, :, c0:c1] = o, l


def segments_backward(q, k, v, grad_out, out, lse, segments, causal, scale, dq, dk, dv) -> None:
    """Write dq (B, H, T, D), dk, dv (B, Hkv, T, D) document by document (each position is in
    one document: its gradients come from that document's calls alone). Chunks run in order:
    each writes its own rows and keys, then adds to the keys before it, written already."""
    out = out.to(q.dtype)
    for b, s, e in segments:
        r = slice(b, b + 1)
        for c0, c1 in itertools.pairwise(_chunks(s, e, causal)):
            run_backward(
                q[r], k[r], v[r], grad_out[r], out[r], lse[r], c0, c1, s, causal, scale,
                dq[r], dk[r], dv[r],
            )  # fmt: skip
