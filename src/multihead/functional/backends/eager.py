"""The reference backend: the textbook formula, softmax in fp32. The only one that returns weights.

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) -> out (B, H, Tq, Dv),
weights (B, H, Tq, Tk).

Variants: `softcap` c turns the scaled scores s into tanh(s / c) * c before the bias and the
mask (as Gemma 2 and transformers do); `sinks` (H,) joins each row's softmax as one more logit
per head (not scaled, capped or masked) whose probability is dropped: it takes mass from the
keys and adds no value (gpt-oss). The weights returned are the keys' probabilities, which then
sum to less than 1. A row with no key left is zeros with or without sinks (its mass is all the
sink's).

It also serves the `hook_attn_scores` / `hook_pattern` hook points: `on_scores` sees the
scaled (and soft-capped), biased scores with blocked keys at -inf, `on_pattern` the
probabilities; either may return a replacement, which the rest of the computation uses.
Replaced scores keep blocked keys blocked; a replaced pattern is used as given (weight it puts
on a blocked key is applied).

Non-finite inputs follow torch's math backend (the rule every backend follows): NaN in q, k, v
or bias makes NaN the output rows it reaches (NaN in q or k reaches its row even through a
blocked key, as torch forms q @ k^T before masking; NaN in v through any weight, as 0 * NaN is
NaN; a NaN bias on a key the mask blocks does not); only a boolean False or a -inf bias blocks a
key (NaN does not); a row with no key left is zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..call import AttentionCall
from .allowed import allowed_mask

TensorHook = Callable[[Tensor], Tensor]


def eager_attention(
    call: AttentionCall,
    *,
    on_scores: TensorHook | None = None,
    on_pattern: TensorHook | None = None,
) -> tuple[Tensor, Tensor | None]:
    q, k, v = call.q, call.k, call.v
    if torch.is_autocast_enabled(q.device.type):
        # The formula states its own precision (fp32 scores and softmax for half inputs);
        # autocast would run its matmuls in half precision and overflow the fp32 mask fill.
        with torch.autocast(q.device.type, enabled=False):
            return eager_attention(call, on_scores=on_scores, on_pattern=on_pattern)
    if call.groups > 1:
        # (B, Hkv, Tk, D) -> (B, H, Tk, D): query head h reads key/value head h // groups.
        k = k.repeat_interleave(call.groups, dim=1)
        v = v.repeat_interleave(call.groups, dim=1)
    # Half precision accumulates scores and probabilities in fp32; fp32/fp64 stay as they are.
    acc = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * call.scale  # (B, H, Tq, Tk)
    if call.softcap is not None:
        scores = torch.tanh(scores / call.softcap) * call.softcap
    allowed = allowed_mask(call)
    # NaN in q or k reaches its row even through a blocked key, as in torch's kernels (they
    # form q @ k^T before masking); the fill below would hide it, so note it first.
    met_nan = scores.isnan().any(dim=-1, keepdim=True) if allowed is not None else None
    if call.bias is not None:
        scores = scores + call.bias.to(acc)
    if call.bias is not None:
        # A -inf bias blocks a key just as the mask does (a row with no key left must not NaN).
        # Only -inf: a NaN score (NaN in q, k or bias) is not a blocked key, it makes its row NaN,
        # as torch's math backend does.
        open_ = scores != float("-inf")
        allowed = open_ if allowed is None else allowed & open_
    if on_scores is not None:
        shown = scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))
        scores = on_scores(shown).to(acc)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(acc).min)
    if call.sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:  # one more column per row, the head's sink logit: (B, H, Tq, Tk + 1) -> drop it
        sink = call.sinks.to(acc).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    if allowed is not None:
        # Finite fill turns a fully masked row into a uniform one; zero it (output and gradients).
        weights = weights.masked_fill(~allowed, 0.0)
    if on_pattern is not None:
        weights = on_pattern(weights).to(acc)
    if call.dropout_p > 0.0:  # as torch, the weights returned are the ones used (after dropout)
        weights = F.dropout(weights, p=call.dropout_p, training=True)
    out = torch.matmul(weights, v.to(acc)).to(q.dtype)  # (B, H, Tq, Dv)
    if met_nan is not None:
        out = torch.where(met_nan, float("nan"), out)
    if allowed is not None and on_pattern is None:
        # a row with no key is zeros, even beside NaN in q, k or v (0 * NaN is NaN)
        out = torch.where(allowed.any(dim=-1, keepdim=True), out, 0.0)
    return out, (weights.to(q.dtype) if call.return_weights else None)
