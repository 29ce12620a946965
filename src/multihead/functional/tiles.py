"""Attention on one tile (a run of queries x a run of keys) with its log-sum-exp, its exact
backward from a saved global log-sum-exp, and the merge of partial results. Shared by ring
attention (parallel/ring_attention.py) and the tiled backend (functional/backends/tiled.py).

Pure torch, accumulated in fp32 (fp64 inputs in fp64). Blocked entries score -inf; a row with no
allowed key in a tile gets lse = -inf and output 0, so it contributes nothing when merged.

Shape legend: B batch, H query heads, Hkv key/value heads, G = H // Hkv, tq / tk the tile's
queries / keys, D head width, Dv value width. Grouped-query heads are handled by viewing
(B, H, ..) as (B, Hkv, G, ..): query head h = kv head h // G, as in `attention()`.
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half types, the input's own for fp32 / fp64."""
    return torch.promote_types(dtype, torch.float32)


def _grouped(x: Tensor, kv_heads: int) -> Tensor:
    # (B, H, t, d) -> (B, Hkv, G, t, d): a view, whatever x's strides.
    B, H, t, d = x.shape
    return x.view(B, kv_heads, H // kv_heads, t, d)


def _scores(
    q: Tensor, k: Tensor, scale: float, allowed: Tensor | None, bias: Tensor | None
) -> Tensor:
    """(B, H, tq, tk) scaled scores in the accumulation dtype, -inf where blocked: a fresh tensor,
    which the callers modify in place (one tile-sized buffer instead of one per step; these run
    outside autograd)."""
    acc = accumulation_dtype(q.dtype)
    B, H, tq, _ = q.shape
    Hkv, tk = k.shape[1], k.shape[2]
    s = torch.einsum("bkgqd,bktd->bkgqt", _grouped(q.to(acc), Hkv), k.to(acc))
    s = s.reshape(B, H, tq, tk).mul_(scale)  # (B, Hkv, G, tq, tk) -> (B, H, tq, tk)
    if bias is not None:
        s.add_(bias.to(acc))  # a -inf bias blocks like the mask
    if allowed is not None:
        s.masked_fill_(~allowed, NEG_INF)
    return s


def tile_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    allowed: Tensor | None,
    bias: Tensor | None,
    keep: Tensor | None,
    dropout_p: float,
) -> tuple[Tensor, Tensor]:
    """Attention of q (B, H, tq, D) over this tile's keys k (B, Hkv, tk, D), v (B, Hkv, tk, Dv).

    Returns (out (B, H, tq, Dv), lse (B, H, tq)) in the accumulation dtype: `out` is normalised
    over this tile alone (softmax over these keys, then dropout `keep / (1 - p)` when `keep` is
    given); `lse` is the log of this tile's softmax denominator.
    """
    s = _scores(q, k, scale, allowed, bias)
    m = s.amax(dim=-1, keepdim=True)  # (B, H, tq, 1)
    m = torch.where(m == NEG_INF, 0.0, m)  # rows with nothing allowed: exp(-inf - 0) = 0
    e = s.sub_(m).exp_()
    denom = e.sum(dim=-1)  # (B, H, tq)
    if keep is not None:
        # The denominator uses every probability; dropout acts on the normalised weights.
        e.mul_(keep).div_(1.0 - dropout_p)
    Hkv = k.shape[1]
    B, H, tq, tk = e.shape
    # (B, Hkv, G, tq, tk) x (B, Hkv, tk, Dv) -> (B, Hkv, G, tq, Dv) -> (B, H, tq, Dv)
    out = torch.einsum("bkgqt,bktd->bkgqd", e.view(B, Hkv, H // Hkv, tq, tk), v.to(e.dtype))
    out = out.reshape(B, H, tq, -1) / torch.where(denom == 0, 1.0, denom)[..., None]
    return out, m[..., 0] + torch.log(denom)  # log(0) = -inf for empty rows


def merge_into(out_acc: Tensor, lse_acc: Tensor, out: Tensor, lse: Tensor) -> None:
    """Fold a tile's (out, lse) into running (out_acc (B, H, t, Dv), lse_acc (B, H, t)), in place:
    the result is the softmax over the union of both key sets."""
    total = torch.logaddexp(lse_acc, lse)
    safe = torch.where(total == NEG_INF, 0.0, total)  # both empty: keep weights 0, not NaN
    w_old = torch.exp(lse_acc - safe)[..., None]
    w_new = torch.exp(lse - safe)[..., None]
    out_acc.mul_(w_old).add_(w_new * out)
    lse_acc.copy_(total)


def tile_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor,
    lse: Tensor,
    delta: Tensor,
    *,
    scale: float,
    allowed: Tensor | None,
    bias: Tensor | None,
    keep: Tensor | None,
    dropout_p: float,
    bias_grad: list[Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of one tile's share of the output, given the GLOBAL lse (B, H, tq) of each query
    row and delta = rowsum(grad_out * out) (B, H, tq), both in the accumulation dtype.

    With P = exp(s - lse) the global probabilities and A = P * keep / (1 - p):
    dV = A^T dO, dP = (dO V^T) * keep / (1 - p), dS = P * (dP - delta), dQ = scale dS K,
    dK = scale dS^T Q. Returns (dq (B, H, tq, D), dk (B, Hkv, tk, D), dv (B, Hkv, tk, Dv)).
    `bias_grad`: a list to which dS (B, H, tq, tk), the gradient of an additive bias on this
    tile's scores, is appended (only attention with a differentiable bias asks for it).
    """
    acc = accumulation_dtype(q.dtype)
    s = _scores(q, k, scale, allowed, bias)
    safe_lse = torch.where(lse == NEG_INF, 0.0, lse)  # a row with no key: all s are -inf
    probs = s.sub_(safe_lse[..., None]).exp_()  # (B, H, tq, tk)
    B, H, tq, tk = probs.shape
    Hkv = k.shape[1]
    G = H // Hkv
    do5 = _grouped(grad_out.to(acc), Hkv)  # (B, Hkv, G, tq, Dv)
    q5 = _grouped(q.to(acc), Hkv)  # (B, Hkv, G, tq, D)
    kept = probs if keep is None else probs * keep / (1.0 - dropout_p)
    # Sum over the G query heads that share each kv head, and over the tile's queries.
    dv = torch.einsum("bkgqt,bkgqd->bktd", kept.view(B, Hkv, G, tq, tk), do5)
    del kept  # (a copy under dropout) free it before the next tile-sized buffer
    dp = torch.einsum("bkgqd,bktd->bkgqt", do5, v.to(acc)).reshape(B, H, tq, tk)
    if keep is not None:
        dp.mul_(keep).div_(1.0 - dropout_p)
    ds = dp.sub_(delta[..., None]).mul_(probs).view(B, Hkv, G, tq, tk)
    if bias_grad is not None:
        bias_grad.append(ds.view(B, H, tq, tk))
    dq = torch.einsum("bkgqt,bktd->bkgqd", ds, k.to(acc)).reshape(B, H, tq, -1) * scale
    dk = torch.einsum("bkgqt,bkgqd->bktd", ds, q5) * scale
    return dq, dk, dv
