"""Encoder, decoder and encoder-decoder stacks of TransformerBlocks, configured by a small frozen
dataclass. Shapes: x (B, T, C); memory (B, S, C); token ids (B, T) -> logits (B, T, V)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..hook_points import hooks_for
from ..positional import SinusoidalPositions
from .attention import MultiHeadAttention
from .block import make_blocks
from .cache import CrossKVCache, KVCache, checkpoints, roll_back
from .init import init_weights
from .model_weights import ModelWeights
from .norm import make_norm


@dataclass(frozen=True)
class StackConfig:
    dim: int
    num_layers: int
    num_heads: int
    ffn_dim: int
    num_kv_heads: int | None = None
    norm_first: bool = True
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    mlp: str = "gelu"
    activation: str = "gelu"
    bias: bool = True
    dropout: float = 0.0


class Encoder(ModelWeights, nn.Module):
    """Blocks (bidirectional self-attention) and, when pre-norm, a final norm.
    Hook points: blocks.{i}.*, ln_final.hook_normalized (pre-norm stacks)."""

    hook_points: tuple[str, ...] = ()
    hook_alias: ClassVar[dict[str, str]] = {"layers": "blocks", "norm": "ln_final"}

    def __init__(self, config: StackConfig, *, init: bool = True) -> None:
        """`init=False` skips `init_weights` (GPT-2's scheme, modules/init.py)."""
        super().__init__()
        self.config = config
        self.layers = make_blocks(config, causal=False)
        self.norm = (
            make_norm(config.norm, config.dim, config.norm_eps)
            if config.norm_first
            else nn.Identity()
        )
        if init:
            init_weights(self)

    @property
    def blocks(self) -> nn.ModuleList:
        """TransformerLens' name for `layers` (the same modules; state_dict keys say layers)."""
        return self.layers

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, key_mask=key_mask)
        return _final_norm(self, x)


class Decoder(ModelWeights, nn.Module):
    """Causal self-attention, cross-attention to the memory, MLP; caches for decoding.
    Hook points: blocks.{i}.* (cross-attention: blocks.{i}.cross_attn.*), ln_final.hook_normalized
    (pre-norm stacks)."""

    hook_points: tuple[str, ...] = ()
    hook_alias: ClassVar[dict[str, str]] = {"layers": "blocks", "norm": "ln_final"}

    def __init__(self, config: StackConfig, *, init: bool = True) -> None:
        """`init=False` skips `init_weights` (GPT-2's scheme, modules/init.py)."""
        super().__init__()
        self.config = config
        self.layers = make_blocks(config, causal=True, cross_attention=True)
        self.norm = (
            make_norm(config.norm, config.dim, config.norm_eps)
            if config.norm_first
            else nn.Identity()
        )
        if init:
            init_weights(self)

    @property
    def blocks(self) -> nn.ModuleList:
        """TransformerLens' name for `layers` (the same modules; state_dict keys say layers)."""
        return self.layers

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        *,
        key_mask: Tensor | None = None,
        memory_key_mask: Tensor | None = None,
        caches: list[KVCache] | None = None,
        cross_caches: list[CrossKVCache] | None = None,
    ) -> Tensor:
        # A layer that fails undoes its own caches' changes; the layers before it are undone
        # here, so the caches stay in step for a corrected retry.
        points = checkpoints(*(caches or ()), *(cross_caches or ()))
        try:
            for i, layer in enumerate(self.layers):
                x = layer(
                    x,
                    key_mask=key_mask,
                    memory=memory,
                    memory_key_mask=memory_key_mask,
                    cache=None if caches is None else caches[i],
                    cross_cache=None if cross_caches is None else cross_caches[i],
                )
        except (ValueError, TypeError):
            roll_back(points)
            raise
        return _final_norm(self, x)


def _final_norm(stack: Encoder | Decoder, x: Tensor) -> Tensor:
    return stack.norm(x)  # ln_final.hook_scale / hook_normalized: the norm's own points


class EncoderDecoder(nn.Module):
    """Token embeddings + sinusoidal positions, an Encoder, a Decoder and a tied output head.
    Hook points: encoder.hook_embed, decoder.hook_embed (token + position embeddings of each
    side), encoder.* and decoder.* (see Encoder and Decoder)."""

    hook_points = ("encoder.hook_embed", "decoder.hook_embed")
    hook_order = ("encoder.hook_embed", "encoder", "decoder.hook_embed", "decoder")

    def __init__(
        self, vocab_size: int, encoder: StackConfig, decoder: StackConfig, *, init: bool = True
    ) -> None:
        """`init=False` skips `init_weights` (GPT-2's scheme, modules/init.py)."""
        super().__init__()
        if encoder.dim != decoder.dim:
            raise ValueError(f"encoder dim {encoder.dim} != decoder dim {decoder.dim}")
        self.embed = nn.Embedding(vocab_size, encoder.dim)
        self.positions = SinusoidalPositions(encoder.dim)
        self.encoder = Encoder(encoder, init=False)
        self.decoder = Decoder(decoder, init=False)
        self.head = nn.Linear(decoder.dim, vocab_size, bias=False)
        self.head.weight = self.embed.weight
        if init:
            init_weights(self)

    def _embed(self, ids: Tensor, start: int = 0, *, side: str = "decoder") -> Tensor:
        x = self.embed(ids) + self.positions(
            torch.arange(start, start + ids.shape[1], device=ids.device)
        )
        hooks = hooks_for(self)
        return x if hooks is None else hooks(f"{side}.hook_embed", x)

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.encoder(self._embed(src_ids, side="encoder"), key_mask=src_mask)

    def forward(
        self, src_ids: Tensor, tgt_ids: Tensor, *, src_mask: Tensor | None = None
    ) -> Tensor:
        memory = self.encode(src_ids, src_mask)
        tgt = self._embed(tgt_ids)
        return self.head(self.decoder(tgt, memory, memory_key_mask=src_mask))

    @torch.inference_mode()
    def greedy(
        self, src_ids: Tensor, bos: int, max_new_tokens: int, *, src_mask: Tensor | None = None
    ) -> Tensor:
        """(B, 1 + new) target ids from `bos`, decoding one token at a time with caches; the
        encoder memory is projected once per layer (CrossKVCache)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens}")
        B = src_ids.shape[0]
        memory = self.encode(src_ids, src_mask)
        a = self.decoder.layers[0].attn
        assert isinstance(a, MultiHeadAttention)
        caches = [
            KVCache(B, a.num_kv_heads, a.head_dim, dtype=memory.dtype) for _ in self.decoder.layers
        ]
        cross = [CrossKVCache() for _ in self.decoder.layers]
        out = torch.full((B, 1), bos, dtype=torch.long, device=src_ids.device)
        for t in range(max_new_tokens):
            x = self._embed(out[:, -1:], start=t)
            h = self.decoder(x, memory, memory_key_mask=src_mask, caches=caches, cross_caches=cross)
            out = torch.cat([out, self.head(h)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return out
