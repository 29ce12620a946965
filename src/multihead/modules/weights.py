"""Weights as a circuits researcher reads them, by TransformerLens' names.

Per attention module (views of the parameters: they follow every change to the weights):
    W_Q (H, d_model, d_head)    b_Q (H, d_head)
    W_K, W_V (H, d_model, d_head), b_K, b_V (H, d_head): expanded to the query heads (GQA:
        query head h reads key/value head h // (H / Hkv), as the attention computes it; a copy)
    _W_K, _W_V (Hkv, d_model, d_head), _b_K, _b_V (Hkv, d_head): per key/value head (views)
    W_O (H, d_head, d_model)    b_O (d_model,)
Per model, stacked over layers (fresh copies at each access, so they too follow the weights):
    W_Q ... b_O with a leading L; W_E (d_vocab, d_model), W_pos (n_ctx, d_model), W_U (d_model,
    d_vocab), b_U (d_vocab,); W_in, b_in, W_out, b_out (W_gate for gated MLPs); QK and OV, the
    circuits as FactoredMatrix (L, H, d_model, d_model); all_composition_scores(mode).

Row-vector convention, as TransformerLens': q = x @ W_Q[h] + b_Q[h] for a normalised residual
row x (after folding, `hook_normalized`); a head writes z @ W_O[h]. Our parameters keep
nn.Linear's (out, in) layout with q, k and v rows packed in `in_proj` (see projections.py); these
are views of them, transposed. A bias a layer does not have reads as zeros.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from ..factored_matrix import FactoredMatrix


def zeros_or(bias: Tensor | None, rows: int, like: Tensor) -> Tensor:
    return torch.zeros(rows, device=like.device, dtype=like.dtype) if bias is None else bias


class AttentionWeights:
    """Mixin of MultiHeadAttention: per-head weights by TransformerLens' names."""

    def _rows(self) -> tuple[list[Tensor], list[Tensor]]:
        """The q, k, v projection weights as (rows, C) views and their biases (rows,)."""
        a = cast(Any, self)  # a MultiHeadAttention
        q_rows, kv_rows = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        if a.packed:
            w, b = a.in_proj.weight, a.in_proj.bias
            # slices, not split(): split's views may not be read after an in-place change
            cuts = (
                slice(0, q_rows),
                slice(q_rows, q_rows + kv_rows),
                slice(q_rows + kv_rows, None),
            )
            weights = [w[rows] for rows in cuts]
            biases = [
                zeros_or(None, w[rows].shape[0], w) if b is None else b[rows] for rows in cuts
            ]
            return weights, biases
        layers = (a.q_proj, a.k_proj, a.v_proj)
        weights = [p.weight for p in layers]
        biases = [zeros_or(p.bias, p.weight.shape[0], p.weight) for p in layers]
        return weights, biases

    def _per_head(self, which: int) -> Tensor:
        """(heads * D, C) -> (heads, C, D): a view."""
        a = cast(Any, self)  # a MultiHeadAttention
        w = self._rows()[0][which]
        return w.view(-1, a.head_dim, w.shape[-1]).transpose(-2, -1)

    def _bias_per_head(self, which: int) -> Tensor:
        a = cast(Any, self)  # a MultiHeadAttention
        return self._rows()[1][which].view(-1, a.head_dim)

    def _expand(self, t: Tensor) -> Tensor:
        """Per kv head (Hkv, ...) -> per query head (H, ...)."""
        a = cast(Any, self)  # a MultiHeadAttention
        groups = a.num_heads // a.num_kv_heads
        return t if groups == 1 else t.repeat_interleave(groups, dim=0)

    @property
    def W_Q(self) -> Tensor:
        return self._per_head(0)

    @property
    def _W_K(self) -> Tensor:
        return self._per_head(1)

    @property
    def _W_V(self) -> Tensor:
        return self._per_head(2)

    @property
    def W_K(self) -> Tensor:
        return self._expand(self._W_K)

    @property
    def W_V(self) -> Tensor:
        return self._expand(self._W_V)

    @property
    def b_Q(self) -> Tensor:
        return self._bias_per_head(0)

    @property
    def _b_K(self) -> Tensor:
        return self._bias_per_head(1)

    @property
    def _b_V(self) -> Tensor:
        return self._bias_per_head(2)

    @property
    def b_K(self) -> Tensor:
        return self._expand(self._b_K)

    @property
    def b_V(self) -> Tensor:
        return self._expand(self._b_V)

    @property
    def W_O(self) -> Tensor:
        a = cast(Any, self)  # a MultiHeadAttention
        w = a.out_proj.weight  # (C, H * D) -> (H, D, C)
        return w.view(w.shape[0], a.num_heads, -1).permute(1, 2, 0)

    @property
    def b_O(self) -> Tensor:
        a = cast(Any, self)  # a MultiHeadAttention
        w = a.out_proj.weight
        return zeros_or(a.out_proj.bias, w.shape[0], w)

    @property
    def QK(self) -> FactoredMatrix:
        """(H, d_model, d_model): x_q @ QK @ x_k^T is the score before scaling and positions."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """(H, d_model, d_model): x @ OV is what a head writes for a source row x (bias aside)."""
        return FactoredMatrix(self.W_V, self.W_O)
