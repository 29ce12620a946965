"""BERT-family encoders as multihead modules: embeddings + post-norm TransformerBlocks.

Shapes: input_ids (B, T) -> hidden states (B, T, C); attention weights (B, H, T, T) per layer;
packed input: input_ids (N,) -> (N, C).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from ...functional.masks import from_hf_padding
from ...functional.varlen import VarLen
from ...hook_points import hooks_for
from ...modules import TransformerBlock
from ...modules.model_weights import ModelWeights
from ...positional.scheme import PositionScheme
from ...value_checks import check_token_ids
from .config import BertConfig


def padded_key_mask(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
    """An encoder's padded call: input_ids (B, T) checked, and the key mask (B, T), True = a
    real token, from Hugging Face's attention_mask (1 = token, 0 = padding) of the same shape;
    None without one."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)
        raise ValueError(f"input_ids must have shape (B, T), got {got}")
    if attention_mask is None:
        return None
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} must match input_ids "
            f"{tuple(input_ids.shape)}"
        )
    return from_hf_padding(attention_mask)


def check_packed_input(
    input_ids: Tensor, packed: VarLen, attention_mask: Tensor | None, return_weights: bool
) -> None:
    """An encoder's packed call (lengths=): tokens (N,) that `packed` covers, and nothing that
    belongs to padded (B, T) input."""
    if attention_mask is not None or return_weights:
        raise ValueError(
            "packed input (lengths) has no padding: attention_mask and return_weights "
            "belong to padded (B, T) input"
        )
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 1:
        got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)
        raise ValueError(f"with lengths, input_ids must be packed tokens (N,), got {got}")
    packed.check(input_ids, "input_ids")


class EncoderOutput(NamedTuple):
    last_hidden_state: Tensor  # (B, T, C); packed input: (N, C)
    attentions: tuple[Tensor, ...] | None  # per layer (B, H, T, T), when asked for


def roberta_positions(input_ids: Tensor, pad: int) -> Tensor:
    """(B, T) -> (B, T): RoBERTa's positions, the count of non-padding tokens so far + pad;
    padding stays at `pad` (as transformers' create_position_ids_from_input_ids)."""
    real = (input_ids != pad).long()
    return real.cumsum(-1) * real + pad


def roberta_positions_packed(input_ids: Tensor, packed: VarLen, pad: int) -> Tensor:
    """(N,) -> (N,): `roberta_positions` of each packed sequence on its own."""
    real = (input_ids != pad).long()
    counts = real.cumsum(0)  # over all sequences; subtract each sequence's start
    lengths = torch.tensor(packed.lengths, device=input_ids.device)
    starts = lengths.cumsum(0) - lengths
    before = torch.where(starts > 0, counts[(starts - 1).clamp(min=0)], 0)  # (n,)
    return (counts - before.repeat_interleave(lengths)) * real + pad


class BertEmbeddings(nn.Module):
    """Word + position (+ token type) embeddings, LayerNorm, dropout.
    Hook points: hook_embed, hook_pos_embed, hook_token_type_embed (models with token types),
    each at the words' shape (B, T, C) or packed (N, C); the normalised sum is
    blocks.0.hook_resid_pre."""

    def __init__(self, config: BertConfig, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        C = config.embedding_size or config.hidden_size
        self.config = config
        self.word_embeddings = nn.Embedding(
            config.vocab_size, C, padding_idx=config.pad_token_id, **factory
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, C, **factory)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, C, **factory) if config.type_vocab_size else None
        )
        self.norm = nn.LayerNorm(C, eps=config.layer_norm_eps, **factory)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.hook_points: tuple[str, ...] = ("hook_embed", "hook_pos_embed")
        if self.token_type_embeddings is not None:
            self.hook_points += ("hook_token_type_embed",)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        packed: VarLen | None = None,
    ) -> Tensor:
        """input_ids (B, T) -> (B, T, C); the packed tokens (N,) of sequences `packed` -> (N, C)."""
        cfg = self.config
        longest = input_ids.shape[1] if packed is None else max(packed.lengths, default=0)
        if longest > cfg.max_length:
            raise ValueError(
                f"sequence length {longest} exceeds the position table ({cfg.max_length} positions)"
            )
        check_token_ids("input_ids", input_ids, cfg.vocab_size, always=True)
        if cfg.position_style == "roberta":
            positions = (
                roberta_positions(input_ids, cfg.pad_token_id)
                if packed is None
                else roberta_positions_packed(input_ids, packed, cfg.pad_token_id)
            )
            position_states = self.position_embeddings(positions)
        elif packed is None:
            position_states = self.position_embeddings.weight[:longest]  # (T, C): i for token i
        else:  # (N, C): positions restart at 0 in each sequence
            position_states = self.position_embeddings(packed.positions(input_ids.device))
        words = self.word_embeddings(input_ids)
        hooks = hooks_for(self)
        if hooks is not None:  # each part at the words' shape, as TransformerLens shows them
            words = hooks("hook_embed", words)
            position_states = hooks("hook_pos_embed", position_states.expand_as(words))
        x = words + position_states
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                types = self.token_type_embeddings.weight[0]  # every token of type 0
            else:
                check_token_ids(
                    "token_type_ids", token_type_ids, cfg.type_vocab_size, what="types", always=True
                )
                types = self.token_type_embeddings(token_type_ids)
            if hooks is not None:
                types = hooks("hook_token_type_embed", types.expand_as(words))
            x = x + types
        elif token_type_ids is not None:
            raise ValueError("token_type_ids given, but this model has no token types")
        return self.dropout(self.norm(x))


class BertEncoder(ModelWeights, nn.Module):
    """A BERT-family encoder (post-norm blocks of multihead.MultiHeadAttention); no pooler.
    Hook points: hook_embed, hook_pos_embed, hook_token_type_embed, blocks.{i}.*."""

    hook_alias: ClassVar[dict[str, str]] = {"layers": "blocks", "embeddings": ""}

    def __init__(
        self,
        config: BertConfig,
        device=None,
        dtype=None,
        *,
        position: Callable[[], PositionScheme | None] | None = None,
    ) -> None:
        """`position` makes each layer's position scheme inside attention (MPNet: a view of
        one shared relative-bias table); BERT itself has none."""
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config, device=device, dtype=dtype)
        # ELECTRA: embeddings narrower than the stream, projected up (None: the same width)
        width = config.embedding_size or config.hidden_size
        self.embeddings_project = (
            nn.Linear(width, config.hidden_size, device=device, dtype=dtype)
            if width != config.hidden_size
            else None
        )
        self.layers = nn.ModuleList(
            TransformerBlock(
                config.hidden_size,
                config.num_attention_heads,
                config.intermediate_size,
                norm_first=False,
                norm_eps=config.layer_norm_eps,
                activation=config.hidden_act,
                dropout=config.hidden_dropout_prob,
                attn_dropout=config.attention_probs_dropout_prob,
                position=None if position is None else position(),
                device=device,
                dtype=dtype,
            )
            for _ in range(config.num_hidden_layers)
        )

    def weight_parts(self) -> dict[str, nn.Module | None]:
        """For W_E and W_pos (see `multihead.modules.weights`); an encoder has no W_U."""
        e = self.embeddings
        return {"embed": e.word_embeddings, "pos": e.position_embeddings}

    @property
    def blocks(self) -> nn.ModuleList:
        """TransformerLens' name for `layers` (the same modules; state_dict keys say layers)."""
        return self.layers

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

        Packed input, which computes nothing on padding: `input_ids` (N,) holds the tokens of
        sequences of `lengths` one after another (no attention_mask); the states are (N, C).
        Token ids outside the vocabulary raise ValueError (see `check_token_ids`).
        """
        if lengths is not None:
            return self._forward_varlen(
                input_ids, VarLen.of(lengths), token_type_ids, attention_mask, return_weights
            )
        key_mask = padded_key_mask(input_ids, attention_mask)
        if token_type_ids is not None and token_type_ids.shape != input_ids.shape:
            raise ValueError(
                f"token_type_ids {tuple(token_type_ids.shape)} must match input_ids "
                f"{tuple(input_ids.shape)}"
            )
        x = self.embeddings(input_ids, token_type_ids)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        weights = []
        for layer in self.layers:
            if return_weights:
                x, w = layer(x, key_mask=key_mask, return_weights=True)
                weights.append(w)
            else:
                x = layer(x, key_mask=key_mask)
        return EncoderOutput(x, tuple(weights) if return_weights else None)

    def _forward_varlen(
        self,
        input_ids: Tensor,
        packed: VarLen,
        token_type_ids: Tensor | None,
        attention_mask: Tensor | None,
        return_weights: bool,
    ) -> EncoderOutput:
        check_packed_input(input_ids, packed, attention_mask, return_weights)
        if token_type_ids is not None and token_type_ids.shape != input_ids.shape:
            raise ValueError(
                f"token_type_ids {tuple(token_type_ids.shape)} must match input_ids "
                f"{tuple(input_ids.shape)}"
            )
        x = self.embeddings(input_ids, token_type_ids, packed)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        for layer in self.layers:
            x = layer(x, lengths=packed)
        return EncoderOutput(x, None)
