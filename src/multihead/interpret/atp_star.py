"""AtP*'s QK fix (Kramar, Lieberum, Shah, Nanda 2024, arXiv 2403.00745, section 3.1): the effect
of patching a head's query or key, estimated without linearising through the softmax.

Patching the query of head h at position t changes only row t of h's attention pattern; patching
the key of key/value head g at position s changes column s of the scores of every query head that
reads g (H / Hkv of them under grouped-query attention). Both changes are recomputed exactly here,
from the attention call as the model ran it (q and k after any q/k norm and rotation, the scale,
soft-cap, bias, mask and sinks), with the clean query or key put in; the metric's change is then
taken linearly in the pattern: (pattern' - pattern) . dmetric/dpattern, the gradient at the
corrupted run. A saturated softmax, whose gradient is ~0 where a different key would take the
mass, is then no longer a blind spot.

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), scores and patterns (B, H, Tq, Tk); query effects
(B, H, Tq); key effects (B, Hkv, Tk) by position, (B, Hkv) for all positions at once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional.backends.allowed import allowed_mask
from ..functional.call import AttentionCall

# How many float64 elements one chunk of per-key-position patterns may hold (~64 MB).
CHUNK_ELEMENTS = 2**23


def scores_of(call: AttentionCall, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor | None]:
    """The attention scores (float64) of `call` with q and k as given, as the eager backend
    forms them (scaled, soft-capped, biased), and the allowed mask (True = may attend; None:
    all), broadcast to (B, H, Tq, Tk)."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1) if groups > 1 else k  # (B, Hkv,..) -> (B, H, ..)
    scores = torch.matmul(q.double(), k.double().transpose(-2, -1)) * call.scale
    if call.softcap is not None:
        scores = torch.tanh(scores / call.softcap) * call.softcap
    allowed = allowed_mask(call)
    if call.bias is not None:
        scores = scores + call.bias.double()
        open_ = scores != float("-inf")
        allowed = open_ if allowed is None else allowed & open_
    if allowed is not None:
        allowed = allowed.expand(scores.shape)
    return scores, allowed


def probabilities(call: AttentionCall, scores: Tensor, allowed: Tensor | None) -> Tensor:
    """Softmax over the last dim of `scores` (..., Tq, Tk) as the eager backend takes it:
    blocked keys get nothing, sinks (H,) join each row and their share is dropped, a row with no
    key left is zeros. `scores` may have extra dims between H and Tq (chunks of patches)."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if call.sinks is not None:
        H = call.sinks.shape[0]
        view = [1, H] + [1] * (scores.dim() - 2)
        sink = call.sinks.double().view(view).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(weights, nan=0.0)  # a fully blocked row: zeros


def query_effects(call: AttentionCall, clean_q: Tensor, grad: Tensor) -> Tensor:
    """(B, H, Tq): the metric's change, linear in the pattern, when head h's query at position t
    is the clean one (row t of h's pattern recomputed; every row at once, as each row depends
    on its own query only). `grad`: dmetric/dpattern at the corrupted run (B, H, Tq, Tk)."""
    scores, allowed = scores_of(call, call.q, call.k)
    patched, _ = scores_of(call, clean_q, call.k)
    change = probabilities(call, patched, allowed) - probabilities(call, scores, allowed)
    return (change * grad.double()).sum(-1)


def key_effects(call: AttentionCall, clean_k: Tensor, grad: Tensor, by_position: bool) -> Tensor:
    """The metric's change, linear in the pattern, when key/value head g's key is the clean one:
    at one key position at a time (B, Hkv, Tk), or at every position at once (B, Hkv). Every
    query head reading g gets its patterns recomputed; their effects are summed over the
    group."""
    B, H, Tq, _ = call.q.shape
    Hkv = call.k.shape[1]
    scores, allowed = scores_of(call, call.q, call.k)
    mixed, _ = scores_of(call, call.q, clean_k)  # every key clean: (B, H, Tq, Tk)
    base = probabilities(call, scores, allowed)
    grad = grad.double()
    if not by_position:
        change = probabilities(call, mixed, allowed) - base
        per_head = (change * grad).sum((-1, -2))  # (B, H)
        return per_head.view(B, Hkv, H // Hkv).sum(-1)  # (B, H) -> (B, Hkv, H / Hkv)
    Tk = scores.shape[-1]
    step = max(1, CHUNK_ELEMENTS // max(1, B * H * Tq * Tk))
    effects = []
    for start in range(0, Tk, step):
        cols = torch.arange(start, min(Tk, start + step), device=scores.device)  # (n,)
        # (B, H, n, Tq, Tk): patch j takes column cols[j] from the clean-key scores
        take = torch.arange(Tk, device=scores.device) == cols[:, None, None]  # (n, 1, Tk)
        patched = torch.where(take, mixed[:, :, None], scores[:, :, None])
        where = None if allowed is None else allowed[:, :, None]
        change = probabilities(call, patched, where) - base[:, :, None]
        effects.append((change * grad[:, :, None]).sum((-1, -2)))  # (B, H, n)
    per_head = torch.cat(effects, dim=-1)  # (B, H, Tk)
    return per_head.view(B, Hkv, H // Hkv, Tk).sum(2)  # (B, H, Tk) -> (B, Hkv, Tk)
