"""A causal language model (GPT-2 layout by default) with cached generation.

Shapes: input_ids (B, T) -> logits (B, T, V). Generation keeps one KVCache per layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..cache import KVCache
from ..functional import masks
from ..hook_points import hooks_for
from ..positional import ALiBi, LearnedPositions, PositionScheme, RopeScaling, RotaryEmbedding
from .attention import MultiHeadAttention
from .block import TransformerBlock, make_blocks
from .norm import make_norm
from .sampling import check_sampling, sample


@dataclass(frozen=True)
class LMConfig:
    vocab_size: int
    dim: int
    num_layers: int
    num_heads: int
    ffn_dim: int | None = None  # default 4 * dim
    num_kv_heads: int | None = None
    max_positions: int = 1024
    position: str = "learned"  # "learned", "rope" or "alibi"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    mlp: str = "gelu"
    activation: str = "gelu_new"
    bias: bool = True
    dropout: float = 0.0
    tie_embeddings: bool = True
    # Llama-family fields; the defaults keep the GPT-2 layout above.
    head_dim: int | None = None  # per-head width; default dim // num_heads
    rope_theta: float = 10000.0  # RoPE base
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None  # each token attends to itself and window - 1 before
    full_attention_layers: tuple[int, ...] = ()  # layers without the window (Qwen2)
    qkv_bias: bool | None = None  # q/k/v projection bias; None: `bias`
    out_bias: bool | None = None  # attention output projection bias; None: `bias`
    mlp_bias: bool | None = None  # None: `bias`
    attn_dropout: float | None = None  # on attention probabilities; None: `dropout`

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer` (None: it attends to every earlier token)."""
        return None if layer in self.full_attention_layers else self.sliding_window


class CausalLM(nn.Module):
    """Token (+ learned position) embeddings, pre-norm blocks, a final norm and the LM head.

    Hook points (see `multihead.interpret`): hook_embed, hook_pos_embed (learned positions),
    blocks.{i}.* (see TransformerBlock and MultiHeadAttention), ln_final.hook_normalized.
    """

    hook_points: tuple[str, ...] = ("hook_embed", "hook_pos_embed", "ln_final.hook_normalized")
    hook_alias: ClassVar[dict[str, str]] = {"layers": "blocks"}
    hook_order = ("hook_embed", "hook_pos_embed", "layers")  # then ln_final.hook_normalized

    def __init__(self, config: LMConfig, device=None, dtype=None) -> None:
        super().__init__()
        if config.position not in ("learned", "rope", "alibi"):
            raise ValueError(f"unknown position {config.position!r}: learned, rope or alibi")
        self.config = config
        factory = {"device": device, "dtype": dtype}
        C, H = config.dim, config.num_heads
        self.tok = nn.Embedding(config.vocab_size, C, **factory)
        self.pos = (
            LearnedPositions(config.max_positions, C, **factory)
            if config.position == "learned"
            else None
        )
        if self.pos is None:  # RoPE / ALiBi: no position embedding to show
            self.hook_points = ("hook_embed", "ln_final.hook_normalized")
        self.drop = nn.Dropout(config.dropout)

        # One RoPE module shared by every layer (it holds no weights, only its frequencies).
        rope = (
            RotaryEmbedding(
                config.head_dim or C // H,
                base=config.rope_theta,
                scaling=config.rope_scaling,
            )
            if config.position == "rope"
            else None
        )

        def position() -> PositionScheme | None:
            if rope is not None:
                return rope
            return ALiBi(H) if config.position == "alibi" else None

        self.layers = make_blocks(
            config, causal=True, norm_first=True, position=position, **factory
        )
        self.norm_f = make_norm(config.norm, C, config.norm_eps, **factory)
        self.head = nn.Linear(C, config.vocab_size, bias=False, **factory)
        if config.tie_embeddings:
            self.head.weight = self.tok.weight
        self._column_major_weights()

    def _column_major_weights(self) -> None:
        """Store every matrix transposed in memory (same shapes, values and state_dict).

        Decoding multiplies one row per sequence by each weight, a pass bound by memory
        bandwidth; MKL streams an (in, out)-contiguous matrix faster than nn.Linear's (out, in)
        one: measured here 13% on GPT-2's layers. load_state_dict copies in place, so loaded
        weights keep this layout. The (tied) head is laid out per generate call instead.
        """
        with torch.no_grad():
            for module in self.layers.modules():
                w = module.weight if isinstance(module, nn.Linear) else None
                if w is not None and not (w.dim() == 2 and w.t().is_contiguous()):
                    module.weight.data = w.data.t().contiguous().t()

    def _head_layout_for(self, rows: int) -> None:
        """Lay the output head out for `rows` rows per step: MKL multiplies one row fastest by a
        column-major head (GPT-2: 6.1 ms vs 10.7), but 2-8 rows fastest as mm(W, h^T) with a
        row-major one (7.3-13.4 ms vs 12-127 ms). One transposition per generate call, in
        place: no second copy of the (vocab x dim) matrix."""
        w = self.head.weight
        want_column_major = rows == 1
        if want_column_major != (w.stride(0) == 1 and w.shape[0] > 1):
            with torch.no_grad():
                w.data = w.data.t().contiguous().t() if want_column_major else w.data.contiguous()

    def logits(self, h: Tensor) -> Tensor:
        """(..., C) -> (..., V) through the output head, in whichever layout it has."""
        w = self.head.weight
        flat = h.reshape(-1, h.shape[-1])
        if flat.shape[0] > 1 and w.is_contiguous() and self.head.bias is None:
            return torch.mm(w, flat.T).T.reshape(*h.shape[:-1], w.shape[0])  # (V, N) -> (N, V)
        return self.head(h)

    def attention(self, layer: int) -> MultiHeadAttention:
        block = self.layers[layer]
        assert isinstance(block, TransformerBlock)
        return block.attn

    def make_caches(self, batch_size: int, max_length: int | None = None) -> list[KVCache]:
        """One cache per layer; `max_length` preallocates (no reallocation while decoding)."""
        p = self.tok.weight
        a = self.attention(0)
        windows = [self.config.window(i) for i in range(len(self.layers))]
        return [
            KVCache(
                batch_size,
                a.num_kv_heads,
                a.head_dim,
                # a static window cache holds 2 * window keys, too few for a longer prompt:
                # windowed layers keep a dynamic one (bounded at window - 1 + T keys)
                max_length=max_length if window is None else None,
                window=window,
                dtype=p.dtype,
                device=p.device,
            )
            for window in windows
        ]

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        caches: list[KVCache] | None = None,
        positions: Tensor | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Logits (B, T, V), or (B, 1, V) with `last_only` (all generation needs after a prefill;
        the head is the largest matrix). `attention_mask` (B, T): 1/True = token, 0 = padding (of
        this call's tokens when caches are given). `positions` default: after the cached tokens,
        or counted over real tokens when there is padding (left padding does not shift them)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (B, T), got {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if caches is not None:
            if len(caches) != len(self.layers):
                raise ValueError(
                    f"expected {len(self.layers)} caches (one per layer), got {len(caches)}"
                )
            if caches[0].batch_size != B:
                raise ValueError(f"the caches were built for batch {caches[0].batch_size}, got {B}")
            for i, cache in enumerate(caches):
                if cache.window != self.config.window(i):
                    raise ValueError(
                        f"caches[{i}] has window {cache.window}, layer {i} attends with window "
                        f"{self.config.window(i)}: make the caches with make_caches"
                    )
        start = caches[0].length if caches else 0
        key_mask = None if attention_mask is None else attention_mask.bool()
        if positions is None:
            if key_mask is not None and start == 0:
                positions = (key_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
            else:
                positions = torch.arange(start, start + T, device=input_ids.device)
        dynamic_rope = self.config.rope_scaling is not None and (
            self.config.rope_scaling.kind == "dynamic"
        )
        if self.config.position == "learned" or (
            self.config.position == "rope" and not dynamic_rope
        ):
            limit = self.config.max_positions
            if positions.numel() and int(positions.max()) >= limit:
                last = int(positions.max())
                raise ValueError(f"position {last} is past the position table ({limit} positions)")
        hooks = hooks_for(self)
        x = self.tok(input_ids)
        if hooks is not None:
            x = hooks("hook_embed", x)
        if self.pos is not None:
            pos = self.pos(positions)
            if hooks is not None:  # (T, C) or (B, T, C) -> (B, T, C), as TransformerLens shows it
                pos = hooks("hook_pos_embed", pos.expand(B, T, pos.shape[-1]))
            x = x + pos
        x = self.drop(x)
        window_mask = None
        if caches is None and self.config.sliding_window is not None:  # caches apply their own
            window_mask = masks.sliding_window(T, T, self.config.sliding_window, device=x.device)
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                mask=None if self.config.window(i) is None else window_mask,
                key_mask=key_mask,
                cache=None if caches is None else caches[i],
                positions=positions if self.config.position == "rope" else None,
            )
        if last_only:
            x = x[:, -1:]
        x = self.norm_f(x)
        if hooks is not None:
            x = hooks("ln_final.hook_normalized", x)
        return self.logits(x)

    @torch.inference_mode()
    def generate_stream(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        *,
        attention_mask: Tensor | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[Tensor]:
        """Yield the next token of every row (B,), one step at a time. Prompts of different
        lengths: left-pad them and pass `attention_mask` (1 = token). temperature 0 = greedy.
        Rows that produced `eos` keep producing `eos`; generation stops when all have."""
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        if prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
            raise ValueError(
                f"prompt_ids must have shape (B, P) with P >= 1, got {tuple(prompt_ids.shape)}"
            )
        B, P = prompt_ids.shape
        mask = (
            torch.ones_like(prompt_ids, dtype=torch.bool)
            if attention_mask is None
            else attention_mask.bool()
        )
        real = mask.sum(-1)  # (B,) prompt lengths
        if (
            self.config.position == "learned"
            and int(real.max()) + max_new_tokens > self.config.max_positions
        ):
            raise ValueError(
                f"prompt ({int(real.max())} tokens) + max_new_tokens ({max_new_tokens}) is longer "
                f"than the position table ({self.config.max_positions} positions)"
            )
        caches = self.make_caches(B, max_length=P + max_new_tokens)
        self._head_layout_for(B)
        logits = self(prompt_ids, attention_mask=mask, caches=caches, last_only=True)[:, -1]
        finished = torch.zeros(B, dtype=torch.bool, device=prompt_ids.device)
        positions = real.clone()
        for step in range(max_new_tokens):
            token = sample(logits, temperature, top_k, top_p, generator)
            if eos is not None:
                token = torch.where(finished, torch.full_like(token, eos), token)
                finished |= token == eos
            yield token
            if step + 1 == max_new_tokens or (eos is not None and bool(finished.all())):
                return
            logits = self(token[:, None], caches=caches, positions=positions[:, None])[:, -1]
            positions += 1

    def generate(self, prompt_ids: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """(B, P + new): the prompts followed by the generated tokens (see generate_stream)."""
        new = list(self.generate_stream(prompt_ids, max_new_tokens, **kwargs))
        return torch.cat([prompt_ids, torch.stack(new, dim=1)], dim=1)
