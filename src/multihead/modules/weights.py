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

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from ..factored_matrix import DEFAULT_MAX_BYTES, FactoredMatrix, all_composition_scores

if TYPE_CHECKING:
    from .attention import MultiHeadAttention
    from .block import TransformerBlock


def _zeros_or(bias: Tensor | None, rows: int, like: Tensor) -> Tensor:
    return torch.zeros(rows, device=like.device, dtype=like.dtype) if bias is None else bias


class AttentionWeights:
    """Mixin of MultiHeadAttention: per-head weights by TransformerLens' names."""

    def _rows(self) -> tuple[list[Tensor], list[Tensor]]:
        """The q, k, v projection weights as (rows, C) views and their biases (rows,)."""
        a = cast("MultiHeadAttention", self)
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
                _zeros_or(None, w[rows].shape[0], w) if b is None else b[rows] for rows in cuts
            ]
            return weights, biases
        layers = (a.q_proj, a.k_proj, a.v_proj)
        weights = [p.weight for p in layers]
        biases = [_zeros_or(p.bias, p.weight.shape[0], p.weight) for p in layers]
        return weights, biases

    def _per_head(self, which: int) -> Tensor:
        """(heads * D, C) -> (heads, C, D): a view."""
        a = cast("MultiHeadAttention", self)
        w = self._rows()[0][which]
        return w.view(-1, a.head_dim, w.shape[-1]).transpose(-2, -1)

    def _bias_per_head(self, which: int) -> Tensor:
        a = cast("MultiHeadAttention", self)
        return self._rows()[1][which].view(-1, a.head_dim)

    def _expand(self, t: Tensor) -> Tensor:
        """Per kv head (Hkv, ...) -> per query head (H, ...)."""
        a = cast("MultiHeadAttention", self)
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
        a = cast("MultiHeadAttention", self)
        w = a.out_proj.weight  # (C, H * D) -> (H, D, C)
        return w.view(w.shape[0], a.num_heads, -1).permute(1, 2, 0)

    @property
    def b_O(self) -> Tensor:
        a = cast("MultiHeadAttention", self)
        w = a.out_proj.weight
        return _zeros_or(a.out_proj.bias, w.shape[0], w)

    @property
    def QK(self) -> FactoredMatrix:
        """(H, d_model, d_model): x_q @ QK @ x_k^T is the score before scaling and positions."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """(H, d_model, d_model): x @ OV is what a head writes for a source row x (bias aside)."""
        return FactoredMatrix(self.W_V, self.W_O)


class ModelWeights:
    """Mixin of the models: weights stacked over layers, embeddings, circuits.

    A model names its parts in `weight_parts()`: {"embed": Embedding, "pos": the learned position
    table, "unembed": the LM head}, any of them absent (RoPE has no W_pos, an encoder no W_U)."""

    def weight_parts(self) -> dict[str, nn.Module | None]:
        return {}

    def _blocks(self) -> list[TransformerBlock]:
        return list(cast(nn.Module, self).layers)  # type: ignore[arg-type]

    def _part(self, key: str, attr: str) -> Any:  # an Embedding / Linear
        part = self.weight_parts().get(key)
        if part is None:
            raise AttributeError(f"{type(self).__name__} has no {attr} (no {key} layer)")
        return part

    def _stack(self, name: str) -> Tensor:
        return torch.stack([getattr(b.attn, name) for b in self._blocks()])

    # attention, (L, ...) — see AttentionWeights for the per-layer shapes
    W_Q = property(lambda self: self._stack("W_Q"))
    W_K = property(lambda self: self._stack("W_K"))
    W_V = property(lambda self: self._stack("W_V"))
    _W_K = property(lambda self: self._stack("_W_K"))
    _W_V = property(lambda self: self._stack("_W_V"))
    W_O = property(lambda self: self._stack("W_O"))
    b_Q = property(lambda self: self._stack("b_Q"))
    b_K = property(lambda self: self._stack("b_K"))
    b_V = property(lambda self: self._stack("b_V"))
    _b_K = property(lambda self: self._stack("_b_K"))
    _b_V = property(lambda self: self._stack("_b_V"))
    b_O = property(lambda self: self._stack("b_O"))

    @property
    def W_E(self) -> Tensor:
        """(d_vocab, d_model): the token embedding (a view)."""
        return self._part("embed", "W_E").weight

    @property
    def W_pos(self) -> Tensor:
        """(n_ctx, d_model): the learned position table (a view)."""
        return self._part("pos", "W_pos").weight

    @property
    def W_U(self) -> Tensor:
        """(d_model, d_vocab): the unembedding (a view of the LM head's weight, transposed)."""
        return self._part("unembed", "W_U").weight.t()

    @property
    def b_U(self) -> Tensor:
        """(d_vocab,): the LM head's bias, zeros when it has none."""
        head = self._part("unembed", "b_U")
        return _zeros_or(head.bias, head.weight.shape[0], head.weight)

    # MLPs, (L, ...), TransformerLens' names: W_in (d_model, d_mlp) is the first layer (the up
    # projection of a gated MLP), W_gate the gate, W_out (d_mlp, d_model) the second layer.
    def _mlp(self, attr: str, first: str, gated: str | None = None) -> Tensor:
        out = []
        for i, block in enumerate(self._blocks()):
            ffn = block.ffn
            if ffn is None:
                raise AttributeError(f"layer {i} has no MLP (attention-only), so no {attr}")
            name = gated if gated is not None and hasattr(ffn, "gate") else first
            if not hasattr(ffn, name):
                raise AttributeError(f"layer {i}'s MLP ({type(ffn).__name__}) has no {attr}")
            layer = getattr(ffn, name)
            if attr.startswith("b_"):
                out.append(_zeros_or(layer.bias, layer.weight.shape[0], layer.weight))
            else:
                out.append(layer.weight.t())
        return torch.stack(out)

    W_in = property(lambda self: self._mlp("W_in", "fc1", "up"))
    b_in = property(lambda self: self._mlp("b_in", "fc1", "up"))
    W_gate = property(lambda self: self._mlp("W_gate", "gate"))
    W_out = property(lambda self: self._mlp("W_out", "fc2", "down"))
    b_out = property(lambda self: self._mlp("b_out", "fc2", "down"))

    @property
    def QK(self) -> FactoredMatrix:
        """(L, H, d_model, d_model): each head's W_Q[l, h] @ W_K[l, h]^T, factored."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """(L, H, d_model, d_model): each head's W_V[l, h] @ W_O[l, h], factored."""
        return FactoredMatrix(self.W_V, self.W_O)

    def process_weights_(
        self,
        *,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
    ) -> Any:
        """Fold the norms into the weights and centre them, in place, as TransformerLens'
        `process_weights_`; the model computes the same logits (see
        `multihead.modules.folding`). Returns the model."""
        from .folding import process_weights_

        return process_weights_(
            cast(nn.Module, self),
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
        )

    def all_composition_scores(self, mode: str, *, max_bytes: int | None = None) -> Tensor:
        """(L, H, L, H): how much head (l1, h1)'s output feeds head (l2, h2)'s query ("Q"),
        key ("K") or value ("V") input (Elhage et al. 2021; TransformerLens' definition):
        ||OV[l1, h1] @ C[l2, h2]||_F / (||OV[l1, h1]||_F ||C[l2, h2]||_F) with C = QK, QK^T or
        OV. Zero unless l1 < l2 (a head reads only earlier layers' outputs). Memory stays
        under about `max_bytes` of products (default 256 MiB; see
        `multihead.factored_matrix.all_composition_scores`)."""
        if mode not in ("Q", "K", "V"):
            raise ValueError(f"mode must be 'Q', 'K' or 'V', got {mode!r}")
        right = {"Q": self.QK, "K": self.QK.T, "V": self.OV}[mode]
        bound = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
        return all_composition_scores(self.OV, right, max_bytes=bound)
