"""Independent fp64 textbook attention: explicit loops over batch, head and query row.

Written from the formula, sharing no code with multihead:
    out_h = softmax(Q_h K_g(h)^T * scale + bias, over allowed keys) V_g(h),  g(h) = h // (H // Hkv)
A query row with no allowed key gives zeros.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) -> out (B, H, Tq, Dv), weights.

    `softcap` c: scores s -> c * tanh(s / c) before the bias (Gemma 2); `sinks` (H,): one more
    logit per head in each row's normaliser, whose probability is dropped (gpt-oss)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    group = H // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    allowed = torch.ones(B, H, Tq, Tk, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask.expand(B, H, Tq, Tk)
    if causal:
        for i in range(Tq):
            for j in range(Tk):
                if j > i + Tk - Tq:
                    allowed[:, :, i, j] = False
    full_bias = torch.zeros(B, H, Tq, Tk, dtype=torch.float64)
    if bias is not None:
        full_bias = full_bias + bias.double().expand(B, H, Tq, Tk)
    out = torch.zeros(B, H, Tq, Dv, dtype=torch.float64)
    weights = torch.zeros(B, H, Tq, Tk, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            g = h // group
            scores = q[b, h] @ k[b, g].T * scale  # (Tq, Tk)
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            scores = scores + full_bias[b, h]
            for i in range(Tq):
                ok = allowed[b, h, i] & (scores[i] > -math.inf)
                if not ok.any():
                    continue
                row = scores[i].masked_fill(~ok, -math.inf)
                top = row.max()
                sink = 0.0 if sinks is None else math.exp(float(sinks[h].detach()) - top)
                e = torch.exp(row - top)
                p = e / (e.sum() + sink)
                weights[b, h, i] = p
                out[b, h, i] = p @ v[b, g]
    return out, weights


def reference_mha(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    w_o: Tensor,
    b_q: Tensor | None,
    b_k: Tensor | None,
    b_v: Tensor | None,
    b_o: Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    mask: Tensor | None = None,
    causal: bool = False,
) -> tuple[Tensor, Tensor]:
    """Textbook multi-head attention, head by head: concat_h(attn(x W_q^h, ...)) W_o^T + b_o.

    query (B, Tq, C), key (B, Tk, kdim), value (B, Tk, vdim); weights as nn.Linear stores them.
    Returns out (B, Tq, C) and per-head weights (B, H, Tq, Tk).
    """

    def lin(x, w, b):
        y = x.double() @ w.double().T
        return y if b is None else y + b.double()

    Q, K, V = lin(query, w_q, b_q), lin(key, w_k, b_k), lin(value, w_v, b_v)
    D = Q.shape[-1] // num_heads
    heads, all_weights = [], []
    for h in range(num_heads):
        g = h // (num_heads // num_kv_heads)
        qh = Q[:, :, h * D : (h + 1) * D][:, None]  # (B, 1, Tq, D)
        kh = K[:, :, g * D : (g + 1) * D][:, None]
        vh = V[:, :, g * D : (g + 1) * D][:, None]
        mh = (
            None
            if mask is None
            else mask.expand(Q.shape[0], num_heads, Q.shape[1], K.shape[1])[:, h : h + 1]
        )
        o, w = reference_attention(qh, kh, vh, mask=mh, causal=causal)
        heads.append(o[:, 0])
        all_weights.append(w[:, 0])
    concat = torch.cat(heads, dim=-1)  # (B, Tq, H*D)
    return lin(concat, w_o, b_o), torch.stack(all_weights, dim=1)


def structure_mask_pairwise(
    batch: int, tq: int, tk: int, *, causal=False, window=None, documents=None, prefix=None
) -> Tensor:
    """(batch, 1, Tq, Tk) may-attend mask of a structured call, written out pair by pair from
    the definitions: query i sits at position p = i + Tk - Tq (bottom-right); causal: j <= p, or
    both before the prefix (an int, or one per row); window W: p - W + 1 <= j <= p + W - 1, or
    (left, right); documents (batch lists of ids): the same document."""
    if isinstance(window, int):
        window = (window - 1, window - 1)
    out = torch.zeros(batch, 1, tq, tk, dtype=torch.bool)
    for b in range(batch):
        p_len = prefix[b] if isinstance(prefix, (list, tuple)) else prefix
        for i in range(tq):
            p = i + tk - tq
            for j in range(tk):
                ok = True
                if causal:
                    ok = j <= p or (p_len is not None and p < p_len and j < p_len)
                if window is not None:
                    ok = ok and p - window[0] <= j <= p + window[1]
                if documents is not None:
                    ok = ok and documents[b][p] == documents[b][j]
                out[b, 0, i, j] = ok
    return out
