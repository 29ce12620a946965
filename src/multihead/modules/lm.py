"""A causal language model (GPT-2 layout by default): the network. Generation lives in
`generation.py`; text in, text out (`to_tokens`, `generate("text")`, `run_with_cache` on text)
is `multihead.CausalLM` (`multihead.models.lm`), this class with the tokenizer it carries.

Shapes: input_ids (B, T) -> logits (B, T, V). Generation keeps one KV cache per layer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..functional import masks
from ..functional.mask_mod import MaskMod
from ..hook_points import caches_as, hooks_for
from ..positional import ALiBi, LearnedPositions, PositionScheme, RopeScaling, RotaryEmbedding
from ..value_checks import check_below, check_token_ids
from . import generation
from .attention import MultiHeadAttention
from .attention_inputs import check_positions
from .block import TransformerBlock, make_blocks
from .cache import KVCache, checkpoints, roll_back
from .generation import head_logits, soft_cap
from .init import init_weights
from .model_weights import ModelWeights
from .module_call import bare
from .norm import make_norm
from .quantized.linear import weight_like
from .static_cache import StaticKVCache


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
    attention_only: bool = False  # blocks without an MLP (mlp is then ignored)
    parallel_residual: bool = False  # attention and MLP both read the block input (GPT-NeoX)
    rotary_dim: int | None = None  # leading values of each head RoPE rotates; None: all
    # Decoder-family data (Gemma 1-3, Qwen3, OLMo 2; read by the shared blocks, see
    # TransformerBlock); the defaults keep the layouts above.
    branch_norms: str = "pre"  # "pre", "pre+post" (Gemma 2/3) or "post" (OLMo 2)
    norm_offset: float = 0.0  # RMSNorm gain = offset + weight (Gemma: 1)
    qk_norm: str | None = None  # "head" (Qwen3, Gemma 3) or "width" (OLMo 2)
    attn_scale: float | None = None  # None: 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar**-0.5)
    attn_softcap: float | None = None  # tanh(s / c) * c of the attention scores (Gemma 2)
    final_softcap: float | None = None  # the same on the logits (Gemma 2)
    embed_scale: bool = False  # embeddings times sqrt(dim), in the model dtype (Gemma)
    local_rope_theta: float | None = None  # RoPE base of the windowed layers (Gemma 3)

    def positions_bounded(self) -> bool:
        """Whether positions past `max_positions` are refused: a learned table ends there, and
        RoPE is trained to there (dynamic RoPE scaling stretches its frequencies instead)."""
        if self.position == "learned":
            return True
        dynamic = self.rope_scaling is not None and self.rope_scaling.kind == "dynamic"
        return self.position == "rope" and not dynamic

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer` (None: it attends to every earlier token)."""
        return None if layer in self.full_attention_layers else self.sliding_window


class CausalLM(ModelWeights, nn.Module):
    """Token (+ learned position) embeddings, pre-norm blocks, a final norm and the LM head, on
    token ids. `multihead.CausalLM` (what the loaders build) adds text: see `models/lm.py`.

    Hook points (see `multihead.interpret`): hook_embed, hook_pos_embed (learned positions),
    blocks.{i}.* (see TransformerBlock and MultiHeadAttention), ln_final.hook_scale,
    ln_final.hook_normalized, and hook_logits (B, T, V): the output of `forward` (TransformerLens
    has no logits hook; this one may be read or replaced like any other).

    Module paths use our attribute names (`layers.{i}`, `norm_f`: the state_dict keys); the
    TransformerLens names `blocks` and `ln_final` are aliases of the same modules. Weights by
    TransformerLens' names (W_E, W_pos, W_U, b_U, W_Q ... b_O, W_in ..., QK, OV,
    all_composition_scores): see `multihead.modules.weights` and `model_weights`.
    """

    hook_points: tuple[str, ...] = ("hook_embed", "hook_pos_embed", "hook_logits")
    hook_alias: ClassVar[dict[str, str]] = {"layers": "blocks", "norm_f": "ln_final"}
    hook_order = ("hook_embed", "hook_pos_embed", "layers", "norm_f", "hook_logits")

    def __init__(self, config: LMConfig, device=None, dtype=None, *, init: bool = True) -> None:
        """`init=False` skips `init_weights` (GPT-2's scheme, see modules/init.py). Checkpoint
        loaders build on the meta device, where initialising costs nothing."""
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
            self.hook_points = ("hook_embed", "hook_logits")
        self.drop = nn.Dropout(config.dropout)

        # One RoPE module shared by every layer (it holds no weights, only its frequencies).
        rope = (
            RotaryEmbedding(
                config.head_dim or C // H,
                base=config.rope_theta,
                scaling=config.rope_scaling,
                rotary_dim=config.rotary_dim,
            )
            if config.position == "rope"
            else None
        )

        # Gemma 3: the windowed layers rotate with their own base (and no scaling), the same
        # leading part of each head as the others
        local = (
            RotaryEmbedding(
                config.head_dim or C // H,
                base=config.local_rope_theta,
                rotary_dim=config.rotary_dim,
            )
            if rope is not None and config.local_rope_theta is not None
            else None
        )

        def position(layer: int) -> PositionScheme | None:
            if rope is not None:
                return local if local is not None and config.window(layer) else rope
            return ALiBi(H) if config.position == "alibi" else None

        self.layers = make_blocks(
            config, causal=True, norm_first=True, position=position, **factory
        )
        self.norm_f = make_norm(config.norm, C, config.norm_eps, config.norm_offset, **factory)
        self.head = nn.Linear(C, config.vocab_size, bias=False, **factory)
        if config.tie_embeddings:
            self.head.weight = self.tok.weight
        if init:
            init_weights(self)
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

    def weight_parts(self) -> dict[str, nn.Module | None]:
        """For W_E, W_pos, W_U, b_U (see `multihead.modules.weights`)."""
        return {"embed": self.tok, "pos": self.pos, "unembed": self.head}

    @property
    def blocks(self) -> nn.ModuleList:
        """TransformerLens' name for `layers` (the same modules)."""
        return self.layers

    @property
    def ln_final(self) -> nn.Module:
        """TransformerLens' name for `norm_f` (the same module)."""
        return self.norm_f

    def logits(self, h: Tensor) -> Tensor:
        """(..., C) -> (..., V) through the output head, in whichever layout it has."""
        if not isinstance(self.head, nn.Linear):  # a packed (quantized) head: its own product
            return soft_cap(self.head(h), self.config.final_softcap)
        return soft_cap(head_logits(h, self.head.weight, self.head.bias), self.config.final_softcap)

    def attention(self, layer: int) -> MultiHeadAttention:
        block = self.layers[layer]
        assert isinstance(block, TransformerBlock)
        return block.attn

    def make_caches(
        self, batch_size: int, max_length: int | None = None, *, static: bool = False
    ) -> list[KVCache] | list[StaticKVCache]:
        """One cache per layer, with the layer's sliding window. `max_length` preallocates (no
        reallocation while decoding); `static=True` gives StaticKVCaches (fixed shapes, for
        compiled decoding; needs `max_length`). The caches hold the dtype the keys will have:
        the weights', or the autocast dtype when autocast is on for the weights' device."""
        p = weight_like(self.tok)
        a = self.attention(0)
        dtype = p.dtype
        if torch.is_autocast_enabled(p.device.type) and p.dtype.is_floating_point:
            dtype = torch.get_autocast_dtype(p.device.type)
        shape = (batch_size, a.num_kv_heads, a.head_dim)
        windows = [self.config.window(i) for i in range(len(self.layers))]
        if static:
            if max_length is None:
                raise ValueError("a static cache needs max_length")
            return [
                StaticKVCache(*shape, max_length, window=w, dtype=dtype, device=p.device)
                for w in windows
            ]
        return [
            KVCache(
                *shape,
                # a static window cache holds 2 * window keys, too few for a longer prompt:
                # windowed layers keep a dynamic one (bounded at window - 1 + T keys)
                max_length=max_length if window is None else None,
                window=window,
                dtype=dtype,
                device=p.device,
            )
            for window in windows
        ]

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        caches: Sequence[KVCache | StaticKVCache] | None = None,
        positions: Tensor | None = None,
        last_only: bool = False,
        window: int | None = None,
        documents: Tensor | None = None,
        prefix: int | Tensor | None = None,
        mask_mod: MaskMod | None = None,
        block_size: int | tuple[int, int] | None = None,
    ) -> Tensor:
        """Logits (B, T, V), or (B, 1, V) with `last_only` (all generation needs after a prefill;
        the head is the largest matrix). `attention_mask` (B, T): 1/True = token, 0 = padding (of
        this call's tokens when caches are given). `positions` default: after the cached tokens,
        counted over real tokens when there is padding (left padding does not shift them).
        `window`: a sliding window for every layer in this call (default: the config's, per
        layer); `documents` (B, T or cached + T) integer ids: packed documents attend only
        within themselves; `prefix`: prefix-LM; `mask_mod`, `block_size`: a mask function of
        (b, h, q_idx, kv_idx) for every layer, q_idx counting cached tokens too (see
        `functional.attention`)."""
        h = self.hidden_states(
            input_ids,
            attention_mask=attention_mask,
            caches=caches,
            positions=positions,
            last_only=last_only,
            window=window,
            documents=documents,
            prefix=prefix,
            mask_mod=mask_mod,
            block_size=block_size,
        )
        hooks = hooks_for(self)
        return self.logits(h) if hooks is None else hooks("hook_logits", self.logits(h))

    def hidden_states(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        caches: Sequence[KVCache | StaticKVCache] | None = None,
        positions: Tensor | None = None,
        last_only: bool = False,
        window: int | None = None,
        documents: Tensor | None = None,
        prefix: int | Tensor | None = None,
        mask_mod: MaskMod | None = None,
        block_size: int | tuple[int, int] | None = None,
    ) -> Tensor:
        """The final normalised states (B, T, C) that the head reads (see `forward`).

        Traceable: checks read shapes and dtypes; token ids and positions are checked against
        the vocabulary and the position table only where values are free to read (eager mode,
        CPU tensors). `generate` checks its inputs once per call on any device."""
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)
            raise ValueError(f"input_ids must have shape (B, T), got {got}")
        check_token_ids("input_ids", input_ids, self.config.vocab_size)
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
        key_mask = None
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
                got = (
                    tuple(attention_mask.shape)
                    if isinstance(attention_mask, Tensor)
                    else type(attention_mask).__name__
                )
                raise ValueError(
                    f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                    f"got {got}"
                )
            key_mask = masks.from_hf_padding(attention_mask)  # (B, T), True = a real token
        positions = self._positions(B, T, input_ids.device, key_mask, caches, positions)
        hooks = hooks_for(self)
        x = self.tok(input_ids)
        if self.config.embed_scale:  # (the factor rounded to the model dtype, as transformers)
            x = x * torch.tensor(self.config.dim**0.5, dtype=x.dtype)
        if hooks is not None:
            x = hooks("hook_embed", x)
        if self.pos is not None:
            pos = self.pos(positions)
            if hooks is not None:  # (T, C) or (B, T, C) -> (B, T, C), as TransformerLens shows it
                pos = hooks("hook_pos_embed", pos.expand(B, T, pos.shape[-1]))
            x = x + pos
        x = self.drop(x)
        # A layer whose checks fail undoes its cache's append (MultiHeadAttention.forward); the
        # layers before it had appended theirs: undone here, so the caches stay in step.
        points = checkpoints(*(caches or ()))
        layers = (x, key_mask, caches, positions, points, window, documents, prefix, mask_mod)
        if torch.compiler.is_compiling():  # (traced: the compiler shares what repeats)
            x = self._layers(*layers, block_size)
        else:
            with ExitStack() as scope:  # RoPE's cos/sin made once per forward, not per layer
                for scheme in self._rotary_schemes():
                    scope.enter_context(scheme.shared_cos_sin())
                x = self._layers(*layers, block_size)
        if last_only:
            x = x[:, -1:]
        return self.norm_f(x)

    def _rotary_schemes(self) -> list[RotaryEmbedding]:
        """The distinct RotaryEmbedding modules the layers rotate by (one, or Gemma 3's two)."""
        found: dict[int, RotaryEmbedding] = {}
        for layer in self.layers:
            scheme = getattr(getattr(layer, "attn", None), "position", None)
            if isinstance(scheme, RotaryEmbedding):
                found[id(scheme)] = scheme
        return list(found.values())

    def _layers(
        self,
        x: Tensor,
        key_mask: Tensor | None,
        caches: Sequence[KVCache | StaticKVCache] | None,
        positions: Tensor,
        points,
        window: int | None,
        documents: Tensor | None,
        prefix: int | Tensor | None,
        mask_mod: MaskMod | None,
        block_size: int | tuple[int, int] | None,
    ) -> Tensor:
        """x (B, T, C) through every layer."""
        layers: nn.ModuleList = self._modules["layers"]  # type: ignore[assignment]
        direct = bare(*layers)  # (each layer's forward, without Module.__call__: module_call)
        try:
            for i, layer in enumerate(layers):
                # The layer's window reaches attention as structure (no (T, T) mask); a cache
                # applies its own window.
                layer_window = window
                if layer_window is None and caches is None:
                    layer_window = self.config.window(i)
                x = (layer.forward if direct else layer)(
                    x,
                    key_mask=key_mask,
                    cache=None if caches is None else caches[i],
                    positions=positions if self.config.position == "rope" else None,
                    window=layer_window,
                    documents=documents,
                    prefix=prefix,
                    mask_mod=mask_mod,
                    block_size=block_size,
                )
        except (ValueError, TypeError):
            roll_back(points)
            raise
        return x

    def _positions(
        self,
        B: int,
        T: int,
        device: torch.device,
        key_mask: Tensor | None,
        caches: Sequence[KVCache | StaticKVCache] | None,
        positions: Tensor | None,
    ) -> Tensor:
        """This call's positions, (T,) or (B, T), checked against the position table.

        Default: after the cached tokens (the cache counts them, on the host or the device),
        plus the real tokens before each one in this call when it has padding."""
        limit = self.config.max_positions
        bounded = self.config.positions_bounded()
        if positions is not None:
            positions = check_positions(positions, B, T, device)
        elif caches is None and key_mask is None:
            if bounded and T > limit:  # a shape check: traceable (a guard on T)
                raise ValueError(f"position {T - 1} is past the position table ({limit} positions)")
            return torch.arange(T, device=device)
        else:
            start = caches[0].next_positions(T, device)[:1] if caches else 0  # (1,) or 0
            if key_mask is None:
                positions = start + torch.arange(T, device=device)
            else:  # real tokens before each one: left padding does not shift positions
                positions = start + (key_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
        if bounded:
            check_below("positions", positions, limit, "position table")
        return positions

    def generate_stream(
        self, prompt_ids: Tensor, max_new_tokens: int, **kwargs
    ) -> Iterator[Tensor]:
        """Yield the next token of every row (B,), one step at a time: see
        `multihead.modules.generation.generate_stream` for the options (sampling, eos, padding,
        compile)."""
        return generation.generate_stream(self, prompt_ids, max_new_tokens, **kwargs)

    @caches_as("positions")
    def generate(self, prompt_ids: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """(B, P + new): the prompts followed by the generated tokens (see generate_stream)."""
        return generation.generate(self, prompt_ids, max_new_tokens, **kwargs)
