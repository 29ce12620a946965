"""The flex backend: torch's `flex_attention` with a BlockMask built from the call's structure.

Every restriction of a call (causality, window, documents, prefix, a mask_mod, a boolean mask)
becomes one `mask_mod(b, h, q_idx, kv_idx)`; `create_block_mask` classifies its blocks, so the
kernel skips empty ones and runs full ones unmasked. A bias becomes a `score_mod`. Queries sit
at key position q_idx + Tk - Tq (bottom-right, as everywhere in multihead).

Where it runs: `backend="auto"` picks it for structured calls on CUDA (the tiled backend owns
CPU, where torch's flex_attention has no backward); by name it also runs CPU forward passes
(inference). It needs torch.compile to be fast: outside a compiled region it calls one compiled
flex_attention (compiled on first use, per shape); inside one, flex_attention is traced in place.

Shapes: q (B, H, Tq, D), k / v (B, Hkv, Tk, D / Dv); mask / bias broadcastable to
(B, H, Tq, Tk) (expanded views, never copied); out (B, H, Tq, Dv).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import (  # torch >= 2.5
    BlockMask,
    create_block_mask,
    flex_attention,
)

from ..call import AttentionCall, variant_reasons
from ..mask_mod import call_mask_mod

# (the tiled backend's threshold, measured on CPU; unmeasured on CUDA: no GPU was at hand)
from .tiled import MIN_PAIRS

ModFn = Callable[..., Tensor]
INF = float("inf")
FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # (CPU refuses float64)


def flex_why_not(call: AttentionCall) -> list[str]:
    reasons = []
    if call.return_weights:
        reasons.append("it cannot return attention weights (the eager backend can)")
    if call.dropout_p > 0.0:
        reasons.append("flex_attention has no attention dropout")
    if call.q.dtype not in FLEX_DTYPES:
        reasons.append(f"flex_attention takes float32, float16 and bfloat16, got {call.q.dtype}")
    if call.q.shape[2] == 0 or call.k.shape[2] == 0:
        reasons.append("empty sequence: flex_attention does not take it")
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (call.q, call.k, call.v)
    )
    if call.q.device.type == "cpu" and needs_grad:
        reasons.append("torch's flex_attention has no backward on CPU (the tiled backend has)")
    if call.bias is not None and call.bias.requires_grad and needs_grad:
        reasons.append("a bias that requires grad (flex's score_mod gives it none here)")
    reasons.extend(variant_reasons(call, "flex_attention (here)"))
    return reasons


def flex_prefer(call: AttentionCall) -> bool:
    """auto runs a call here on CUDA when it has structure and is big enough to pay."""
    return call.q.device.type == "cuda" and pays(call)


def pays(call: AttentionCall) -> bool:
    """A structured call of at least MIN_PAIRS (query, key) pairs per head: below that (a
    decode step over a window cache, short texts) sdpa under the dense mask costs little, and
    flex would build a BlockMask (and compile for a new shape) on every call."""
    return call.structure is not None and call.q.shape[2] * call.k.shape[2] >= MIN_PAIRS


def flex_run(call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    q, k, v = call.q, call.k, call.v
    if not torch.is_grad_enabled():  # (torch's CPU flex refuses inputs that require grad)
        q, k, v = q.detach(), k.detach(), v.detach()
    B, H, tq, _ = q.shape
    tk = k.shape[2]
    mask_mod, by_batch, by_head = _mask_mod(call, B, H, tq, tk)
    compiling = torch.compiler.is_compiling()
    block_mask = None
    if mask_mod is not None:
        # On CUDA, compiled: the mask function is evaluated block by block (eager
        # create_block_mask first builds the whole (B or 1, H or 1, Tq, Tk) boolean mask).
        # Not on CPU: torch 2.13's C++ code generation fails on the documents mask there
        # (operands of ?: of different VecMask types), and CPU runs here are by name only.
        eager = compiling or q.device.type != "cuda"
        make = _eager_block_mask if eager else _compiled_block_mask()
        block_mask = make(
            mask_mod, B if by_batch else None, H if by_head else None, tq, tk, device=q.device
        )
    # (traced in place inside a compiled region; else the compiled one)
    run = _eager if compiling else _compiled(static=q.device.type == "cpu")
    out = run(
        q, k, v, score_mod=_score_mod(call.bias, B, H, tq, tk), block_mask=block_mask,
        scale=call.scale, enable_gqa=q.shape[1] != k.shape[1],
    )  # fmt: skip
    return out, None


_eager: Callable[..., Tensor] = flex_attention  # (one signature for mypy: it is overloaded)
_eager_block_mask: Callable[..., BlockMask] = create_block_mask


@functools.cache
def _compiled_block_mask() -> Callable[..., BlockMask]:
    """create_block_mask compiled once for the process, as torch advises (see `_compiled`)."""
    return torch.compile(create_block_mask)


@functools.cache
def _compiled(static: bool) -> Callable[..., Tensor]:
    """flex_attention compiled once for the process (torch keeps its graphs per shape and mask
    function, recompiling as they change): a cache of compiled code, not state that changes
    per call. `static` on CPU: with torch's automatic dynamic shapes, a second window made
    the window's ints symbolic and torch 2.13's C++ code generation then failed on every
    later call ("'cur_kvSplitSize5' was not declared"); static graphs recompile per shape
    and window instead."""
    return torch.compile(flex_attention, dynamic=False if static else None)


def _mask_mod(call: AttentionCall, B: int, H: int, tq: int, tk: int):
    """(mask_mod or None when every pair is allowed, depends on b, depends on h)."""
    s = call.structure
    offset = tk - tq  # query q_idx sits at key position q_idx + offset
    terms: list[ModFn] = []
    by_batch = by_head = False
    prefix = None if s is None else s.prefix
    if call.causal:
        if prefix is None:
            terms.append(lambda b, h, i, j: j <= i + offset)
        else:
            at = _per_batch(prefix)
            by_batch = by_batch or isinstance(prefix, Tensor)
            terms.append(
                lambda b, h, i, j: (j <= i + offset) | ((i + offset < at(b)) & (j < at(b)))
            )
    if s is not None and s.window is not None:
        left, right = s.window
        terms.append(lambda b, h, i, j: (j >= i + offset - left) & (j <= i + offset + right))
    if s is not None and s.documents is not None:
        docs = s.documents  # (B, Tk)
        by_batch = True
        terms.append(lambda b, h, i, j: docs[b, i + offset] == docs[b, j])
    if s is not None and s.mask_mod is not None:
        user = s.mask_mod
        by_batch = by_head = True
        terms.append(lambda b, h, i, j: call_mask_mod(user, b, h, i + offset, j))
    if call.mask is not None:
        mask = call.mask.expand(B, H, tq, tk)  # a view: broadcast dims stay stride 0
        by_batch = by_batch or call.mask.shape[0] != 1
        by_head = by_head or call.mask.shape[1] != 1
        terms.append(lambda b, h, i, j: mask[b, h, i, j])
    if not terms:
        return None, False, False

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = terms[0](b, h, q_idx, kv_idx)
        for term in terms[1:]:
            allowed = allowed & term(b, h, q_idx, kv_idx)
        return allowed

    return mask_mod, by_batch, by_head


def _per_batch(prefix: int | Tensor) -> Callable[[Tensor], Tensor | int]:
    """The prefix length of batch row b: an int, or a (B,) tensor read at b."""
    if isinstance(prefix, Tensor):
        return lambda b: prefix[b]
    return lambda b: prefix


def _score_mod(bias: Tensor | None, B: int, H: int, tq: int, tk: int) -> ModFn:
    """score (+ bias[b, h, q, k], read from an expanded view of the bias), NaN made +inf.

    flex_attention drops NaN scores (a NaN query row came out as zeros, a NaN key was
    ignored); multihead's rule is that NaN reaches the rows that read it. A +inf score does:
    the row's running max becomes inf and exp(inf - inf) is NaN. Blocked pairs are masked
    after this, so only the rows that read the NaN turn NaN."""
    if bias is None:

        def nan_to_inf(score, b, h, q_idx, kv_idx):
            return torch.where(torch.isnan(score), INF, score)

        return nan_to_inf
    full = bias.expand(B, H, tq, tk)

    def with_bias(score, b, h, q_idx, kv_idx):
        s = score + full[b, h, q_idx, kv_idx].to(score.dtype)
        return torch.where(torch.isnan(s), INF, s)

    return with_bias
