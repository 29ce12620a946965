"""ModernBERT as multihead modules: token embeddings + LayerNorm (no positions), pre-norm
TransformerBlocks (GeGLU MLP, RoPE with one base for global layers and another for local
ones, a symmetric sliding window on local layers, no attention norm in the first layer), a
final LayerNorm.

Shapes: input_ids (B, T) -> hidden states (B, T, C); attention weights (B, H, T, T) per layer;
packed input: input_ids (N,) -> (N, C).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from ...functional.varlen import VarLen
from ...hook_points import hooks_for
from ...modules import TransformerBlock
from ...modules.model_weights import ModelWeights
from ...modules.norm import LayerNorm
from ...positional.rope import RotaryEmbedding
from ...value_checks import check_token_ids
from ..bert.model import EncoderOutput, check_packed_input, padded_key_mask
from .config import ModernBertConfig


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout. Hook point: hook_embed (B, T, C); the normalised
    embeddings are blocks.0.hook_resid_pre."""

    hook_points: tuple[str, ...] = ("hook_embed",)

    def __init__(self, config: ModernBertConfig, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config = config
        C = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, C, **factory)
        self.norm = LayerNorm(C, eps=config.layer_norm_eps, bias=config.norm_bias, **factory)
        self.dropout = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: Tensor) -> Tensor:
        check_token_ids("input_ids", input_ids, self.config.vocab_size, always=True)
        words = self.word_embeddings(input_ids)
        hooks = hooks_for(self)
        if hooks is not None:
            words = hooks("hook_embed", words)
        return self.dropout(self.norm(words))


class ModernBertEncoder(ModelWeights, nn.Module):
    """A ModernBERT encoder (no MLM head). Hook points: hook_embed, blocks.{i}.*, ln_final.*.
    The first block's ln1 is an Identity (ModernBERT normalises the embeddings instead)."""

    hook_alias: ClassVar[dict[str, str]] = {
        "layers": "blocks",
        "embeddings": "",
        "final_norm": "ln_final",
    }

    def __init__(self, config: ModernBertConfig, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config = config
        C, H = config.hidden_size, config.num_attention_heads
        self.embeddings = ModernBertEmbeddings(config, **factory)
        self.layers = nn.ModuleList()
        for i in range(config.num_hidden_layers):
            base = config.local_rope_theta if config.is_local(i) else config.global_rope_theta
            block = TransformerBlock(
                C,
                H,
                config.intermediate_size,
                norm_first=True,
                norm_eps=config.layer_norm_eps,
                mlp="geglu",
                activation=config.hidden_act,
                bias=config.attention_bias,
                mlp_bias=config.mlp_bias,
                dropout=config.attention_dropout,
                attn_dropout=config.attention_dropout,
                position=RotaryEmbedding(C // H, base=base),
                **factory,
            )
            # LayerNorms with ModernBERT's optional bias; none before the first attention
            block.norm1 = (
                nn.Identity()
                if i == 0
                else LayerNorm(C, eps=config.layer_norm_eps, bias=config.norm_bias, **factory)
            )
            block.norm2 = LayerNorm(C, eps=config.layer_norm_eps, bias=config.norm_bias, **factory)
            self.layers.append(block)
        self.final_norm = LayerNorm(C, eps=config.layer_norm_eps, bias=config.norm_bias, **factory)

    def weight_parts(self) -> dict[str, nn.Module | None]:
        """For W_E (see `multihead.modules.weights`); no position table, no W_U."""
        return {"embed": self.embeddings.word_embeddings, "pos": None}

    @property
    def blocks(self) -> nn.ModuleList:
        """TransformerLens' name for `layers` (the same modules; state_dict keys say layers)."""
        return self.layers

    def windows(self) -> list[tuple[int, int] | None]:
        """Each layer's (left, right) window: local layers see half_window keys each side."""
        w = self.config.half_window
        return [(w, w) if self.config.is_local(i) else None for i in range(len(self.layers))]

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        return_weights: bool = False,
        lengths: VarLen | Sequence[int] | None = None,
    ) -> EncoderOutput:
        """input_ids (B, T); attention_mask (B, T) as Hugging Face's 1 = token, 0 = padding.
        Token i sits at position i (right padding keeps the real tokens' positions, as
        transformers' ModernBertModel).

        Packed input: `input_ids` (N,) holds the tokens of sequences of `lengths` one after
        another (no attention_mask); the states are (N, C). The sliding window is a per-row
        structure, so packed sequences run as a right-padded batch inside.
        """
        if token_type_ids is not None:
            raise ValueError("token_type_ids given, but ModernBERT has no token types")
        if lengths is not None:
            return self._forward_varlen(
                input_ids, VarLen.of(lengths), attention_mask, return_weights
            )
        key_mask = padded_key_mask(input_ids, attention_mask)
        x = self.embeddings(input_ids)
        weights = []
        for layer, window in zip(self.layers, self.windows(), strict=True):
            structure = {} if window is None else {"window": window}
            if return_weights:
                x, w = layer(x, key_mask=key_mask, return_weights=True, **structure)
                weights.append(w)
            else:
                x = layer(x, key_mask=key_mask, **structure)
        x = self.final_norm(x)
        return EncoderOutput(x, tuple(weights) if return_weights else None)

    def _forward_varlen(
        self,
        input_ids: Tensor,
        packed: VarLen,
        attention_mask: Tensor | None,
        return_weights: bool,
    ) -> EncoderOutput:
        check_packed_input(input_ids, packed, attention_mask, return_weights)
        device = input_ids.device
        n, longest = len(packed.lengths), max(packed.lengths, default=0)
        rows = torch.repeat_interleave(
            torch.arange(n, device=device), torch.tensor(packed.lengths, device=device)
        )  # (N,): each token's sequence
        cols = packed.positions(device)  # (N,): its place in the sequence
        ids = input_ids.new_full((n, longest), self.config.pad_token_id)  # (N,) -> (n, T)
        ids[rows, cols] = input_ids
        mask = torch.zeros(n, longest, dtype=torch.long, device=device)
        mask[rows, cols] = 1
        hidden = self.forward(ids, mask).last_hidden_state  # (n, T, C)
        return EncoderOutput(hidden[rows, cols], None)  # (n, T, C) -> (N, C)
