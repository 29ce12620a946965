"""The fused backend: torch.nn.functional.scaled_dot_product_attention.

Torch's kernels differ by version and device in what a query row with no allowed key returns
(NaN in several). We make such rows attend everywhere inside the kernel (finite, no NaN in the
backward either) and zero their output afterwards, with tensor ops only (no sync, compile-safe).
A row is dead when the mask, causality and `-inf` entries of the bias *together* leave it no
key, so they are combined before the test.

A mask or bias together with `causal=True` runs in chunks of queries: each chunk builds only its
own (rows, Tk) slice of the combined mask and reads only the keys its last query can see, so a
key mask plus causality costs O(T) memory per row block instead of a T x T tensor, and the
fully masked upper triangle is skipped.

Non-finite inputs follow torch's math backend (as the eager backend does): NaN in q, k, v or
bias makes NaN the rows it reaches; only a boolean False or a -inf bias blocks a key.

Shapes: q (B, H, Tq, D), k/v (B, Hkv, Tk, D); masks 4-D, broadcastable to (B, H, Tq, Tk).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..call import AttentionCall, default_scale, variant_reasons
from .allowed import allowed_mask, causal_block

# Mask elements one chunk may build (B x mask heads x rows x Tk): 16M booleans (16 MB; SDPA's
# float copy of it 32-64 MB). Calls below it run whole.
CHUNK_ELEMENTS = 2**24
MIN_CHUNK_ROWS = 128
# Below this many keys torch's unmasked CPU kernel (torch 2.13) gives 0, not NaN, for a NaN
# query row; tests/test_hostile_numerics.py sweeps key counts against the math backend.
NAN_QUIRK_KEYS = 16

# torch's kernel itself (what `F.scaled_dot_product_attention` is bound to), looked up once: code
# that swaps multihead's drop-in into `torch.nn.functional` (as tools/run_torch_tests.py does)
# must not make this backend call the drop-in, and so itself.
_sdpa = torch._C._nn.scaled_dot_product_attention
_is_compiling = torch.compiler.is_compiling  # (bound once: a module attribute lookup less)


def sdpa_why_not(call: AttentionCall) -> list[str]:
    reasons = []
    if call.return_weights:
        reasons.append("it cannot return attention weights (the eager backend can)")
    tq, tk = call.q.shape[2], call.k.shape[2]
    if tq == 0 or tk == 0:
        reasons.append(f"empty sequence (Tq={tq}, Tk={tk}): torch's kernels do not take it")
    if call.softcap is not None:  # (sinks it takes: `_with_sinks`)
        reasons.extend(variant_reasons(call._replace(sinks=None), "torch's SDPA"))
    return reasons


def sdpa_attention(call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    if call.sinks is not None:
        return _with_sinks(call), None
    q, k, v, mask, bias, causal, scale, dropout_p = call[:8]
    tq, tk = q.shape[2], k.shape[2]
    if mask is None and bias is None:
        flag = _kernel_causal(causal, tq, tk)
        if flag is not None:
            return _plain(q, k, v, dropout_p, flag, scale, tk), None
    if causal and tq * tk * q.shape[0] > CHUNK_ELEMENTS:  # (mask or bias is set here)
        rows = _chunk_rows(call)
        if rows < tq:
            return _chunked(call, rows), None
    allowed = allowed_mask(call)
    if allowed is None and bias is None:  # e.g. one causal query, which sees every key
        return _plain(q, k, v, dropout_p, False, scale, tk), None
    return _fused(q, k, v, allowed, bias, scale, dropout_p, _gqa(q, k)), None


def sdpa_plain(q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float) -> Tensor | None:
    """What `sdpa_attention` returns for q, k, v alone (no mask, bias, structure or weights;
    the default scale), without an `AttentionCall`; None where it would not be one plain
    kernel call (an empty length, which `sdpa_why_not` refuses, or causality that needs a
    mask). For `functional.attention.dispatch_plain`."""
    tq, tk = q.shape[2], k.shape[2]
    if tq == 0 or tk == 0:
        return None
    flag = _kernel_causal(causal, tq, tk)
    if flag is None:
        return None
    return _plain(q, k, v, dropout_p, flag, default_scale(q.shape[3]), tk)


def _kernel_causal(causal: bool, tq: int, tk: int) -> bool | None:
    """The kernel's causal flag for a call without mask or bias, or None where causality needs
    a mask: one query (the last position: a decode step) sees every key, and top-left and
    bottom-right causality coincide when tq == tk; then no row can be empty and the kernel
    does all. (Branches, not `causal and tq != 1`: SDPA's flag must be a Python bool, never a
    symbolic one.)"""
    if tq == 1:
        return False
    if not causal or tq == tk:
        return causal
    return None


def _gqa(q: Tensor, k: Tensor) -> bool:
    """Whether query and key head counts differ, as a Python bool: with dynamic shapes
    (torch.compile(dynamic=True)) the comparison is symbolic, which SDPA's flag refuses; a
    branch turns it into a guard and a constant."""
    if q.shape[1] != k.shape[1]:  # noqa: SIM103
        return True
    return False


def _plain(
    q: Tensor, k: Tensor, v: Tensor, dropout_p: float, causal: bool, scale: float, tk: int
) -> Tensor:
    """The kernel alone, on a call without mask or bias; `tk` = the key count."""
    gqa = _gqa(q, k)
    if dropout_p == 0.0 and not causal and not gqa:  # a decode step: each keyword costs ~0.5 us
        out = _sdpa(q, k, v, scale=scale)
    else:
        out = _sdpa(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale, enable_gqa=gqa)
    # Compiled, the correction is always applied (fused, nearly free): a test of the key count
    # would guard a growing KV cache's length and recompile when it crosses the threshold.
    if q.is_cpu and (_is_compiling() or tk < NAN_QUIRK_KEYS):
        # torch's fused CPU kernel, unmasked and with fewer than 16 keys, returns 0 for a query
        # row whose scores are all NaN (a NaN query row; NaN in every key it sees), where the
        # math backend, and every longer call, return NaN: add 0 * the row's and its keys'
        # max, NaN exactly when they hold NaN (max propagates NaN, cannot overflow). No sync;
        # detached, so the backward pass is the kernel's own. Shapes only decide it, so longer
        # calls (where the kernel propagates NaN itself) pay nothing.
        seen = q.detach().amax(dim=-1, keepdim=True) + _keys_seen_max(q, k, causal)
        out = out + seen.to(out.dtype) * 0.0
    return out


def _keys_seen_max(q: Tensor, k: Tensor, causal: bool) -> Tensor:
    """(B, H, Tq or 1, 1): the max over the keys each query row sees (NaN where one holds
    NaN): all of them, or with the kernel's causality (Tq == Tk) keys 0 .. i for row i."""
    seen = k.detach().amax(dim=-1)  # (B, Hkv, Tk)
    # (B, Hkv, Tk) causal: cummax carries NaN on, as max does; else (B, Hkv, 1)
    seen = torch.cummax(seen, dim=-1).values if causal else seen.amax(dim=-1, keepdim=True)
    B, Hkv, R = seen.shape
    H = q.shape[1]
    # grouped-query heads: query head h reads kv head h // (H // Hkv)
    seen = seen[:, :, None].expand(B, Hkv, H // Hkv, R).reshape(B, H, R)
    return seen[..., None]


def _chunk_rows(call: AttentionCall) -> int:
    """Query rows per chunk so that one chunk's combined mask stays under CHUNK_ELEMENTS."""
    heads = max(1 if t is None else t.shape[1] for t in (call.mask, call.bias))
    per_row = call.q.shape[0] * heads * call.k.shape[2]
    return max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // max(per_row, 1))


def _rows(t: Tensor | None, start: int, stop: int, keys: int) -> Tensor | None:
    """Rows start:stop and the first `keys` keys of a 4-D mask/bias (broadcast dims stay 1)."""
    if t is None:
        return None
    if t.shape[2] != 1:
        t = t[:, :, start:stop]
    return t if t.shape[3] == 1 else t[..., :keys]


def _chunked(call: AttentionCall, rows: int) -> Tensor:
    q, k, v, mask, bias, _, scale, dropout_p = call[:8]
    gqa = _gqa(q, k)
    tq, tk = q.shape[2], k.shape[2]
    outs = []
    for start in range(0, tq, rows):
        stop = min(start + rows, tq)
        keys = min(tk, stop + tk - tq)  # the last query of the chunk sees keys 0 .. keys - 1
        if keys <= 0:  # Tq > Tk: these queries precede every key (bottom-right): nothing to see
            outs.append(q.new_zeros(*q.shape[:2], stop - start, v.shape[3]))
            continue
        allowed = causal_block(start, stop, tq, tk, q.device)[:, :keys]
        chunk_mask = _rows(mask, start, stop, keys)
        allowed = allowed if chunk_mask is None else chunk_mask & allowed
        outs.append(
            _fused(
                q[:, :, start:stop],
                k[:, :, :keys],
                v[:, :, :keys],
                allowed,
                _rows(bias, start, stop, keys),
                scale,
                dropout_p,
                gqa,
            )
        )
    return torch.cat(outs, dim=2)


def _fused(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None,
    bias: Tensor | None,
    scale: float,
    dropout_p: float,
    gqa: bool,
) -> Tensor:
    """SDPA with a may-attend mask and/or an additive bias; rows with no key give zeros."""
    keep = allowed
    if bias is not None:
        # a -inf bias blocks its key just as the mask does; NaN does not (its row becomes NaN)
        open_ = bias != float("-inf")
        keep = open_ if keep is None else keep & open_
    assert keep is not None  # the caller runs unmasked calls without this function
    row_ok = keep.any(dim=-1, keepdim=True)  # (..., Tq, 1): False where a query sees no key
    attn_mask: Tensor
    if bias is None:
        attn_mask = keep | ~row_ok  # dead rows attend everywhere; their output is zeroed below
    else:
        low = torch.finfo(q.dtype).min
        attn_mask = torch.where(keep, bias.to(q.dtype), low).masked_fill(~row_ok, 0.0)
    out = _sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=gqa)
    # torch.where keeps the kernel's (B, T, H, D) memory layout, so the caller's
    # (B, H, T, D) -> (B, T, H*D) reshape stays free; masked_fill would densify it (2 copies).
    return torch.where(row_ok, out, 0.0)


def _with_sinks(call: AttentionCall) -> Tensor:
    """Sink logits as one more key: k and v gain a zero row (its score q . 0 is 0), whose
    bias is the head's sink logit; so it takes its share of each row's softmax and adds
    nothing to the output. Every restriction (mask, causality, -inf bias) becomes a -inf bias
    on the real keys: the sink keeps every row alive, and a row with no key left is zeros
    (all its mass is the sink's). Costs a (B, H, Tq, Tk + 1) bias."""
    q, k, v = call.q, call.k, call.v
    B, H, tq, _ = q.shape
    tk = k.shape[2]
    zeros = k.new_zeros(B, k.shape[1], 1, k.shape[3])  # (B, Hkv, 1, D)
    k = torch.cat([k, zeros], dim=2)  # (B, Hkv, Tk + 1, D)
    v = torch.cat([v, v.new_zeros(B, v.shape[1], 1, v.shape[3])], dim=2)
    bias = q.new_zeros(B, H, tq, tk) if call.bias is None else call.bias.to(q.dtype)
    bias = bias.expand(B, H, tq, tk)
    allowed = allowed_mask(call)
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))
    assert call.sinks is not None
    sink = call.sinks.to(q.dtype).view(1, H, 1, 1).expand(B, H, tq, 1)
    bias = torch.cat([bias, sink], dim=-1)  # (B, H, Tq, Tk + 1)
    return _fused(q, k, v, None, bias, call.scale, call.dropout_p, _gqa(q, k))
