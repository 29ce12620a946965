"""BERT-family encoders as multihead modules: config, model and the checkpoint key map.

Shapes: input_ids (B, T) -> hidden states (B, T, C); attention weights (B, H, T, T) per layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from ..functional.masks import from_hf_padding
from ..functional.varlen import VarLen
from ..hook_points import hooks_for
from ..modules import TransformerBlock
from ..modules.feedforward import ACTIVATIONS
from ..value_checks import check_token_ids
from .keymap import Rule, convert_state_dict, pair


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    pad_token_id: int = 0
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1

    @classmethod
    def from_dict(cls, config: dict) -> BertConfig:
        """From a Hugging Face config.json; ValueError naming what is unsupported or missing."""
        model_type = config.get("model_type")
        if model_type != "bert":
            archs = ", ".join(config.get("architectures") or []) or "none listed"
            raise ValueError(
                f"unsupported architecture: model_type {model_type!r} (architectures: {archs}); "
                "multihead loads BERT-family checkpoints with model_type 'bert'"
            )
        position = config.get("position_embedding_type", "absolute")
        if position != "absolute":
            raise ValueError(
                f"unsupported position_embedding_type {position!r}; only 'absolute' is supported"
            )
        names = {f.name for f in fields(cls)}
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [n for n in required if n not in config]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}")
        values = {k: v for k, v in config.items() if k in names}
        cfg = cls(**values)
        if cfg.hidden_act not in ACTIVATIONS:
            known = ", ".join(sorted(ACTIVATIONS))
            raise ValueError(f"unsupported hidden_act {cfg.hidden_act!r}; known: {known}")
        if cfg.hidden_size % cfg.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size {cfg.hidden_size} is not divisible by "
                f"num_attention_heads {cfg.num_attention_heads}"
            )
        return cfg


class EncoderOutput(NamedTuple):
    last_hidden_state: Tensor  # (B, T, C); packed input: (N, C)
    attentions: tuple[Tensor, ...] | None  # per layer (B, H, T, T), when asked for


class BertEmbeddings(nn.Module):
    """Word + position + token type embeddings, LayerNorm, dropout.
    Hook points: hook_embed, hook_pos_embed, hook_token_type_embed (each (B, T, C) or packed
    (N, C)); the normalised sum is blocks.0.hook_resid_pre."""

    hook_points = ("hook_embed", "hook_pos_embed", "hook_token_type_embed")

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        C = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, C, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, C)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, C)
        self.norm = nn.LayerNorm(C, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        packed: VarLen | None = None,
    ) -> Tensor:
        """input_ids (B, T) -> (B, T, C); the packed tokens (N,) of sequences `packed` -> (N, C)."""
        longest = input_ids.shape[1] if packed is None else max(packed.lengths, default=0)
        table = self.position_embeddings.num_embeddings
        if longest > table:
            raise ValueError(
                f"sequence length {longest} exceeds the position table ({table} positions)"
            )
        if packed is None:
            position_states = self.position_embeddings.weight[:longest]  # (T, C): i for token i
        else:  # (N, C): positions restart at 0 in each sequence
            position_states = self.position_embeddings(packed.positions(input_ids.device))
        if token_type_ids is None:
            types = self.token_type_embeddings.weight[0]  # every token of type 0
        else:
            types = self.token_type_embeddings(token_type_ids)
        words = self.word_embeddings(input_ids)
        hooks = hooks_for(self)
        if hooks is not None:  # each part at the words' shape, as TransformerLens shows them
            words = hooks("hook_embed", words)
            position_states = hooks("hook_pos_embed", position_states.expand_as(words))
            types = hooks("hook_token_type_embed", types.expand_as(words))
        x = words + position_states + types
        return self.dropout(self.norm(x))


class BertEncoder(nn.Module):
    """BERT's encoder (post-norm blocks of multihead.MultiHeadAttention); no pooler.
    Hook points: hook_embed, hook_pos_embed, hook_token_type_embed, blocks.{i}.*."""

    hook_alias: ClassVar[dict[str, str]] = {"layers": "blocks", "embeddings": ""}

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
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
            )
            for _ in range(config.num_hidden_layers)
        )

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
        """
        if lengths is not None:
            return self._forward_varlen(
                input_ids, VarLen.of(lengths), token_type_ids, attention_mask, return_weights
            )
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)
            raise ValueError(f"input_ids must have shape (B, T), got {got}")
        self._check_ids(input_ids, token_type_ids)
        key_mask = None
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(
                    f"attention_mask {tuple(attention_mask.shape)} must match input_ids "
                    f"{tuple(input_ids.shape)}"
                )
            key_mask = from_hf_padding(attention_mask)  # (B, T), True = a real token
        x = self.embeddings(input_ids, token_type_ids)
        weights = []
        for layer in self.layers:
            if return_weights:
                x, w = layer(x, key_mask=key_mask, return_weights=True)
                weights.append(w)
            else:
                x = layer(x, key_mask=key_mask)
        return EncoderOutput(x, tuple(weights) if return_weights else None)

    def _check_ids(self, input_ids: Tensor, token_type_ids: Tensor | None) -> None:
        """Integer ids (always) inside the vocabularies (where values are free to read: eager
        mode, CPU tensors; see `multihead.value_checks`)."""
        check_token_ids("input_ids", input_ids, self.config.vocab_size)
        if token_type_ids is not None:
            check_token_ids("token_type_ids", token_type_ids, self.config.type_vocab_size)

    def _forward_varlen(
        self,
        input_ids: Tensor,
        packed: VarLen,
        token_type_ids: Tensor | None,
        attention_mask: Tensor | None,
        return_weights: bool,
    ) -> EncoderOutput:
        if attention_mask is not None or return_weights:
            raise ValueError(
                "packed input (lengths) has no padding: attention_mask and return_weights "
                "belong to padded (B, T) input"
            )
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 1:
            got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)
            raise ValueError(f"with lengths, input_ids must be packed tokens (N,), got {got}")
        packed.check(input_ids, "input_ids")
        if token_type_ids is not None and token_type_ids.shape != input_ids.shape:
            raise ValueError(
                f"token_type_ids {tuple(token_type_ids.shape)} must match input_ids "
                f"{tuple(input_ids.shape)}"
            )
        self._check_ids(input_ids, token_type_ids)
        x = self.embeddings(input_ids, token_type_ids, packed)
        for layer in self.layers:
            x = layer(x, lengths=packed)
        return EncoderOutput(x, None)


# Our parameters <- Hugging Face BertModel keys (after the optional 'bert.' prefix is removed).
BERT_KEY_MAP: list[Rule] = [
    *Rule.same(
        "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight",
    ),
    *pair("embeddings.norm", "embeddings.LayerNorm"),
    # query, key and value rows stacked into one packed projection: one matmul per layer
    *pair(
        "layers.{i}.attn.in_proj",
        "encoder.layer.{i}.attention.self",
        cat=(".query", ".key", ".value"),
    ),
    *pair("layers.{i}.attn.out_proj", "encoder.layer.{i}.attention.output.dense"),
    *pair("layers.{i}.norm1", "encoder.layer.{i}.attention.output.LayerNorm"),
    *pair("layers.{i}.ffn.fc1", "encoder.layer.{i}.intermediate.dense"),
    *pair("layers.{i}.ffn.fc2", "encoder.layer.{i}.output.dense"),
    *pair("layers.{i}.norm2", "encoder.layer.{i}.output.LayerNorm"),
]
# Present in BERT checkpoints but not part of the encoder: the pooler and task heads (unused),
# and the position-id buffer.
BERT_IGNORED = ("pooler.", "cls.", "embeddings.position_ids")


def _normalise_keys(checkpoint: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drop the 'bert.' prefix (BertFor* checkpoints) and rename old LayerNorm gamma/beta."""
    out = {}
    for key, value in checkpoint.items():
        key = key.removeprefix("bert.")
        if key.endswith("LayerNorm.gamma"):
            key = key[: -len("gamma")] + "weight"
        elif key.endswith("LayerNorm.beta"):
            key = key[: -len("beta")] + "bias"
        out[key] = value
    return out


def load_bert_weights(model: BertEncoder, checkpoint: dict[str, Tensor]) -> None:
    expected = {k: v.shape for k, v in model.state_dict().items()}
    state = convert_state_dict(
        _normalise_keys(checkpoint),
        BERT_KEY_MAP,
        num_layers=model.config.num_hidden_layers,
        expected=expected,
        ignored_prefixes=BERT_IGNORED,
    )
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
