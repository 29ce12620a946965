"""How torch's `scaled_dot_product_attention` lays out its inputs, mapped onto multihead's call.

torch takes q `(..., L, E)`, k `(..., S, E)`, v `(..., S, Ev)` with any leading dimensions that
broadcast against each other (its math kernel is two matmuls), and with `enable_gqa=True` reads
dim -3 as heads: key and value heads must each divide the query heads (they may differ from each
other). An `attn_mask` must broadcast to the score tensor `broadcast(q, k leading) + (L, S)`
(torch adds it in place), which can be smaller than the output when only v is larger.

Here every input becomes `(B, H, T, D)`: the last leading axis is the head axis, the ones before
it fold into B. Broadcasting uses `expand` (views); a key or value with one head next to a
many-headed query stays one head (grouped-query attention computes the same thing without copies).

Shape legend: B batch (folded), H query heads, Hkv key/value heads, L queries, S keys,
E query/key width, Ev value width.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .call import shape_str


class Layout(NamedTuple):
    """q (B, H, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev) and the shapes around them."""

    q: Tensor
    k: Tensor
    v: Tensor
    batch: tuple[int, ...]  # the leading axes folded into B (before the head axis)
    heads: int  # H
    scores: tuple[int, ...]  # what an attn_mask must broadcast to: torch's score shape
    out: tuple[int, ...]  # the output shape torch returns


def _broadcast(what: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        raise ValueError(
            f"the leading dimensions of {what} do not broadcast: "
            + ", ".join(str(tuple(s)) for s in shapes)
        ) from None


def _fold(t: Tensor, batch: tuple[int, ...], heads: int) -> Tensor:
    """(..., h, T, D) broadcast to batch + (heads, T, D) -> (B, heads, T, D); a view unless
    broadcast batch axes must be merged."""
    full = t.expand(*batch, heads, *t.shape[-2:])
    if len(batch) == 1:
        return full
    return full.reshape(math.prod(batch), heads, *t.shape[-2:])


def layout(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool) -> Layout:
    """torch's broadcasting rules for q, k, v -> 4-D tensors for `make_call`."""
    L, S, Ev = query.shape[-2], key.shape[-2], value.shape[-1]
    if enable_gqa:
        if min(query.dim(), key.dim(), value.dim()) < 3:
            raise ValueError(
                "enable_gqa=True reads dim -3 as the head axis, so query, key and value need at "
                f"least 3 dimensions; got query {shape_str(query)}, key {shape_str(key)}, "
                f"value {shape_str(value)}"
            )
        H, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if hk == 0 or hv == 0 or H % hk or H % hv:
            raise ValueError(
                f"with enable_gqa=True the key heads ({hk}) and value heads ({hv}) must each "
                f"divide the query heads ({H}) (dim -3 of query {shape_str(query)})"
            )
        lq, lk, lv = query.shape[:-3], key.shape[:-3], value.shape[:-3]
        batch = _broadcast("query, key and value", lq, lk, lv)
        scores = (*_broadcast("query and key", lq, lk), H, L, S)
        out = (*batch, H, L, Ev)
        if hk != hv:
            # Key and value heads differ: repeat both to a common count (their lcm, which
            # divides H) so that query head h still reads key head h // (H // hk) and value
            # head h // (H // hv).
            hkv = math.lcm(hk, hv)
            key = key.repeat_interleave(hkv // hk, dim=-3)
            value = value.repeat_interleave(hkv // hv, dim=-3)
        hkv = key.shape[-3]
    else:
        lq, lk, lv = query.shape[:-2], key.shape[:-2], value.shape[:-2]
        lead = _broadcast("query, key and value", lq, lk, lv)
        scores = (*_broadcast("query and key", lq, lk), L, S)
        out = (*lead, L, Ev)
        # The last leading axis is the head axis (1 when there is none).
        batch, H = (lead[:-1], lead[-1]) if lead else ((), 1)
        # The head axis of k and v is 1 or H; one shared key/value head runs as grouped-query
        # attention with one group (the same arithmetic as broadcasting, without a copy).
        heads_of = [t.shape[-3] if t.dim() > 2 else 1 for t in (key, value)]
        hkv = H if H in heads_of else 1
    q4 = _fold(query, batch, H)  # (..., L, E) -> (B, H, L, E)
    k4 = _fold(key, batch, hkv)  # (..., S, E) -> (B, Hkv, S, E)
    v4 = _fold(value, batch, hkv)  # (..., S, Ev) -> (B, Hkv, S, Ev)
    return Layout(q4, k4, v4, batch, H, scores, out)
