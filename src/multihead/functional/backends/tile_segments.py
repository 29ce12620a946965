"""Documents that sit in contiguous runs (packed training sequences): one fused kernel call per
document, causal inside it when the call is, instead of a plan of tiles.

Each row belongs to one document, so a document's call gives that row's final output and
log-sum-exp: nothing to merge, no mask, and the backward pass is one kernel backward per
document. Ids that come back after another document (a document split in two runs) are not
contiguous: the general tile plan serves those calls (`segment_plan` returns None).

Shapes: q (B, H, T, D), k / v (B, Hkv, T, D / Dv) (the kernel reads grouped heads itself);
documents (B, T); out (B, H, T, Dv), lse (B, H, T); a plan lists (b, start, stop) runs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...value_checks import may_read
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


def segments_forward(q, k, v, segments, causal: bool, scale: float, out, lse) -> None:
    """Write out (B, H, T, Dv) and lse (B, H, T) document by document."""
    for b, s, e in segments:
        o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q[b : b + 1, :, s:e], k[b : b + 1, :, s:e], v[b : b + 1, :, s:e],
            is_causal=causal, scale=scale,
        )  # fmt: skip
        out[b : b + 1, :, s:e] = o
        lse[b : b + 1, :, s:e] = l


def segments_backward(q, k, v, grad_out, out, lse, segments, causal, scale, dq, dk, dv) -> None:
    """Write dq (B, H, T, D), dk, dv (B, Hkv, T, D) document by document (each position is in
    one document: its gradients come from that call alone)."""
    out = out.to(q.dtype)
    for b, s, e in segments:
        r = (slice(b, b + 1), slice(None), slice(s, e))
        dq_t, dk_t, dv_t = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out[r], q[r], k[r], v[r], out[r], lse[r].to(q.dtype), 0.0, causal, scale=scale
        )
        dq[r], dk[r], dv[r] = dq_t, dk_t, dv_t
