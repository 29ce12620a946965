"""Weights stacked over a model's layers, by TransformerLens' names (W_Q ... b_O with a leading
L, W_E, W_pos, W_U, b_U, W_in ... b_out, QK, OV, all_composition_scores) and
`process_weights_` (see `folding.py`): the model-level half of `weights.py`, which holds the
per-head views of one attention module.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from ..factored_matrix import DEFAULT_MAX_BYTES, FactoredMatrix, all_composition_scores
from .block import TransformerBlock
from .folding import process_weights_
from .weights import zeros_or


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
        return zeros_or(head.bias, head.weight.shape[0], head.weight)

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
                out.append(zeros_or(layer.bias, layer.weight.shape[0], layer.weight))
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
