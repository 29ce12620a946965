"""MultiHeadAttention: owns the projections and the reshapes; the math is one `AttentionCall`
through `functional.dispatch`.

Shape legend: B batch, Tq/Tk query/key lengths, C embed_dim, H heads, Hkv key/value heads,
D head_dim, N packed tokens.

A forward is four steps, the same in every mode: project (and split heads), place the keys
(positions, cache), attend, merge heads and project out. Padded self-attention, cross-attention
(key/value or a CrossKVCache) and KV-cached decoding differ only in where the keys come from
(a `KeySet`); packed sequences (`lengths=`) have their own short path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..functional.attention import dispatch
from ..functional.call import (
    check_dropout,
    check_flag,
    check_mask,
    check_softcap,
    make_call,
    resolve_scale,
)
from ..functional.mask_mod import MaskMod
from ..functional.masks import combine
from ..functional.varlen import VarLen
from ..hook_points import hooks_for
from ..positional.scheme import PositionScheme
from .attend import ATTENTION_HOOK_POINTS, ROTARY_HOOK_POINTS, attend
from .attention_inputs import (
    SLOTS_REFUSE_STRUCTURE,
    Inputs,
    batch_inputs,
    narrowest,
    positive_int,
    structure_after_dropped_keys,
    structure_args,
)
from .attention_keys import queries_and_keys
from .attention_packed import forward_packed, refuse_with_lengths
from .attention_plain import plain_forward, static_row_attention
from .attention_positions import position_bias
from .attention_project import blocked_output, output, project, project_key_value, project_query
from .blocked_projection import blocked_projection_serves
from .cache import CrossKVCache, KVCache, checkpoints, roll_back
from .projections import plain_pair
from .projections import submodule as _sub
from .projections import weight_of as _weight
from .static_cache import StaticKVCache
from .weights import AttentionWeights

QKV_HOOK_POINTS = ("hook_q", "hook_k", "hook_v")  # (shown TransformerLens' way: views)


class MultiHeadAttention(AttentionWeights, nn.Module):
    """Multi-head attention with grouped-query support: self or cross, masked, causal.

    Self-attention with `kdim == vdim == embed_dim` uses one packed projection `in_proj`
    (rows ordered q, k, v) and so one fused matmul; otherwise `q_proj`, `k_proj`, `v_proj`.

    Args:
        embed_dim: width C of the query input and of the output.
        num_heads: query heads H.
        num_kv_heads: key/value heads Hkv (must divide H); defaults to H. 1 = multi-query.
        head_dim: width D of each head; defaults to `embed_dim // num_heads`.
        kdim, vdim: widths of the key and value inputs (cross-attention); default `embed_dim`.
        bias: biases on the q/k/v projections (and, by default, the output projection).
        out_bias: bias on the output projection; defaults to `bias` (Qwen2: q/k/v only).
        dropout: dropout on the attention probabilities, in training mode only.
        causal: default for `forward(causal=...)`.
        position: a `PositionScheme` (`RotaryEmbedding` rotates q and k, `ALiBi` adds its
            bias), applied to self-attention; positions continue from a KV cache's length.
        scale: multiplies `q @ k^T`; default `1 / sqrt(head_dim)` (Gemma:
            `query_pre_attn_scalar ** -0.5`).
        softcap: logit soft-capping `tanh(s / softcap) * softcap` of the scaled scores
            (Gemma 2), see `functional.attention`.
        sinks: True gives a learned sink logit per query head (parameter `sinks`, (H,),
            gpt-oss), see `functional.attention`.
        q_norm, k_norm: modules applied to q (B, H, T, D) and k (B, Hkv, T, D) after their
            projections and hooks (hook_q, hook_k), before RoPE (Qwen3, Gemma 3, OLMo 2: see
            `modules.qk_norm.HeadNorm`).

    Hook points (see `multihead.interpret`): hook_q, hook_k, hook_v (B, T, H or Hkv, D; before
    rotation), hook_rot_q, hook_rot_k (after RoPE; only with it), hook_attn_scores, hook_pattern
    (B, H, Tq, Tk; scores after scale and soft-capping, with blocked keys at -inf; the
    pattern's rows sum to 1 minus the sink's share where there are sinks), hook_z
    (B, Tq, H, D), hook_result (B, Tq, H, C).

    Per-head weights by TransformerLens' names (W_Q, W_K, W_V, W_O, b_*, _W_K, QK, OV): see
    `multihead.modules.weights`.
    """

    hook_points: tuple[str, ...] = ATTENTION_HOOK_POINTS
    # Set by multihead.parallel.sequence_parallel: runs forward as ring attention over a group.
    _sequence_parallel: Callable[..., Tensor] | None = None

    # The steps of `forward`, one concept a file (functions of the module, bound as methods):
    _plain_forward = plain_forward  # the common call (attention_plain.py)
    _project = project  # 1. projections (attention_project.py)
    _project_query = project_query
    _project_key_value = project_key_value
    _queries_and_keys = queries_and_keys  # 2. queries and keys (attention_keys.py)
    _output = output  # 4. merge heads, output projection (attention_project.py)

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        out_bias: bool | None = None,
        dropout: float = 0.0,
        causal: bool = False,
        position: PositionScheme | None = None,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: bool = False,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        embed_dim = positive_int("embed_dim", embed_dim)
        num_heads = positive_int("num_heads", num_heads)
        num_kv_heads = positive_int(
            "num_kv_heads", num_heads if num_kv_heads is None else num_kv_heads
        )
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
        if head_dim is None:
            if embed_dim % num_heads != 0:
                raise ValueError(
                    f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}) "
                    "when head_dim is not given"
                )
            head_dim = embed_dim // num_heads
        head_dim = positive_int("head_dim", head_dim)
        kdim = positive_int("kdim", embed_dim if kdim is None else kdim)
        vdim = positive_int("vdim", embed_dim if vdim is None else vdim)
        self.embed_dim, self.kdim, self.vdim = embed_dim, kdim, vdim
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dropout = check_dropout(dropout, "dropout")
        self.causal = check_flag("causal", causal)
        self.packed = kdim == embed_dim and vdim == embed_dim
        q_width, kv_width = num_heads * head_dim, num_kv_heads * head_dim
        factory = {"device": device, "dtype": dtype}
        if self.packed:
            self.in_proj = nn.Linear(embed_dim, q_width + 2 * kv_width, bias=bias, **factory)
        else:
            self.q_proj = nn.Linear(embed_dim, q_width, bias=bias, **factory)
            self.k_proj = nn.Linear(kdim, kv_width, bias=bias, **factory)
            self.v_proj = nn.Linear(vdim, kv_width, bias=bias, **factory)
        out_bias = bias if out_bias is None else out_bias
        self.out_proj = nn.Linear(q_width, embed_dim, bias=out_bias, **factory)
        if position is not None:
            if not isinstance(position, PositionScheme):
                raise TypeError(
                    "position must be a multihead.positional.PositionScheme (RotaryEmbedding, "
                    f"ALiBi, ...) or None, got {type(position).__name__}"
                )
            position.check(num_heads, head_dim)
            if position.uses_positions:
                self.hook_points = ROTARY_HOOK_POINTS
        self.position = position  # (also sets _rotates and _plain_position: __setattr__)
        self.scale = None if scale is None else resolve_scale(scale, head_dim)
        self.softcap = check_softcap(softcap)
        self.sinks = (
            nn.Parameter(torch.zeros(num_heads, **factory)) if check_flag("sinks", sinks) else None
        )
        self.q_norm, self.k_norm = q_norm, k_norm
        # (a plain attribute: the hot path in forward tests it, and takes it only when False)
        self._variant = (
            self.scale is not None
            or self.softcap is not None
            or sinks
            or q_norm is not None
            or k_norm is not None
        )

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "position":
            # (plain attributes, read by the hot path in forward: no position scheme, or one
            # that only rotates q and k, which the plain path does in place (RoPE); kept in
            # step when a scheme is replaced, as tensor parallelism does)
            rotates = value is not None and value.rotates_heads
            object.__setattr__(self, "_rotates", rotates)
            object.__setattr__(self, "_plain_position", value is None or rotates)

    def _variants(self) -> dict:
        """The attention-variant arguments of this module's calls (see `make_call`)."""
        return {
            "scale": self.scale,
            "softcap": self.softcap,
            "sinks": self.sinks,
            "variants_checked": True,  # (at construction)
        }

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"kdim={self.kdim}, vdim={self.vdim}, dropout={self.dropout}, causal={self.causal}"
            + "".join(
                f", {name}={value}"
                for name, value in (("scale", self.scale), ("softcap", self.softcap))
                if value is not None
            )
            + (", sinks=True" if self.sinks is not None else "")
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        causal: bool | None = None,
        return_weights: bool = False,
        cache: KVCache | CrossKVCache | None = None,
        positions: Tensor | None = None,
        lengths: VarLen | Sequence[int] | None = None,
        window: int | tuple[int, int] | None = None,
        documents: Tensor | None = None,
        prefix: int | Tensor | None = None,
        mask_mod: MaskMod | None = None,
        block_size: int | tuple[int, int] | None = None,
    ):
        """Attend from `query` `(B, Tq, C)` to `key` `(B, Tk, kdim)` / `value` `(B, Tk, vdim)`.

        `key` and `value` default to `query` (self-attention); `value` defaults to `key`.
        `mask`: boolean, True = may attend, broadcastable to `(B, H, Tq, Tk)`.
        `key_mask`: `(B, Tk)`, True = a real key (padding is False).
        `causal`: overrides the constructor's default (bottom-right aligned).
        Unbatched `(T, C)` inputs give unbatched outputs.
        `cache`: a `KVCache` (self-attention: this call's keys are appended and every cached key is
        attended, causal alignment bottom-right; `key_mask` then covers this call's tokens only)
        or a `CrossKVCache` (the memory's keys/values are computed at the first call, then reused).
        `positions`: (Tq,) or (B, Tq) integer positions for RoPE; default: from the cache's
        length (or 0). Refused when the position scheme does not use positions.
        `lengths`: self-attention over packed sequences: `query` is `(N, C)`, the tokens of
        sequences of these lengths one after another (see `functional.varlen`); each attends
        only to itself, with no padding computed, and RoPE/ALiBi positions restart at 0 in
        each. Returns `(N, C)`.
        `window`, `documents` (B, Tk), `prefix`: the structure of `functional.attention`
        (sliding window, packed documents by id, prefix-LM), passed on as such; with a
        `KVCache`, positions count every token so far (documents (B, tokens so far), a
        prefix of P tokens, mask_mod's indices), also past what a window cache dropped;
        queries are the last positions.
        `mask_mod`, `block_size`: a mask function of (b, h, q_idx, kv_idx) and the tile it is
        classified by, as `functional.attention` (q_idx, kv_idx: token positions).

        Returns `(B, Tq, C)`, or `(output, weights (B, H, Tq, Tk))` when `return_weights=True`.
        """
        # The hot path first (batched self-attention through the packed projection, no position
        # scheme or RoPE; nothing of the call's own to decide: no key input, mask, structure,
        # weights; positions only for RoPE; no cache or a KVCache), in as few tests as
        # possible: at small shapes each costs ~0.5% of the call (`multihead bench attention`,
        # small calls). Anything else takes the general path.
        if (
            key is None
            and value is None
            and mask is None
            and key_mask is None
            and (positions is None or self._rotates)  # (positions mean nothing to others)
            and lengths is None
            and window is None
            and documents is None
            and prefix is None
            and mask_mod is None
            and block_size is None
            and return_weights is False
            and (cache is None or type(cache) is KVCache)
            and self._sequence_parallel is None
            and self._plain_position
            # (traced, a rotating scheme takes the general path: the plain path's in-place
            # rotation of the projection's view, appended to a cache, fails dynamo's checks)
            and not (self._rotates and torch.compiler.is_compiling())
            and self.packed
            and not self._variant
            and isinstance(query, Tensor)
            and query.dim() == 3
        ):
            layers: dict[str, Any] = self._modules  # (registered: never None)
            in_proj, out_proj = layers["in_proj"], layers["out_proj"]
            # Plain nn.Linear projections run as F.linear on their parameters (and give the
            # weight to test the query against straight from _parameters: weight_like's
            # attribute lookup misses on nn.Linear, raising and catching an AttributeError)
            direct = plain_pair(in_proj, out_proj)
            weight: Tensor = out_proj._parameters["weight"] if direct else _weight(out_proj)
            if (
                query.shape[2] == self.embed_dim
                and query.dtype == weight.dtype
                and query.device == weight.device
                and hooks_for(self) is None
            ):
                causal = self.causal if causal is None else check_flag("causal", causal)
                return self._plain_forward(query, causal, cache, direct, positions)
        structured = (
            window is not None
            or documents is not None
            or prefix is not None
            or mask_mod is not None
            or block_size is not None
        )
        if self._variant and (self._sequence_parallel is not None or lengths is not None):
            raise ValueError(
                "scale=, softcap=, sinks= and q/k norms (q_norm, k_norm) are not supported with "
                "packed sequences (lengths=) "
                "or sequence parallelism: run the padded batch"
            )
        if self._sequence_parallel is not None:  # this rank holds a chunk of the sequence
            structure = structure_args(window, documents, prefix, mask_mod, block_size)
            extra = {name: arg for name, arg in structure.items() if arg is not None}
            return self._sequence_parallel(
                self, query, key, value, mask=mask, key_mask=key_mask, causal=causal,
                return_weights=return_weights, cache=cache, positions=positions, lengths=lengths,
                **extra,
            )  # fmt: skip
        causal = self.causal if causal is None else check_flag("causal", causal)
        hooks = hooks_for(self)
        if lengths is not None:
            structure = structure_args(window, documents, prefix, mask_mod, block_size)
            refuse_with_lengths(
                key, value, mask, key_mask, cache, positions, return_weights, structure
            )
            return forward_packed(self, query, VarLen.of(lengths), causal, hooks)
        weight = _weight(_sub(self, "out_proj"))
        if (
            key is None
            and value is None
            and key_mask is None
            and (cache is None or not cache.cross)
            and isinstance(query, Tensor)
            and query.dim() == 3
            and query.shape[-1] == self.embed_dim
            and query.dtype == weight.dtype
            and query.device == weight.device
        ):
            # Batched self-attention, no key mask, no cache or a self-attention cache: the
            # inputs need no more checks.
            x = Inputs(query, None, None, None, True, False)
        else:
            cross_cache = cache is not None and cache.cross
            x = batch_inputs(self, query, key, value, key_mask, cross_cache)
        if isinstance(cache, StaticKVCache):  # (it cannot undo its writes: check first)
            if structured:
                raise ValueError(SLOTS_REFUSE_STRUCTURE)
            if mask is not None:
                B, Tq = x.query.shape[0], x.query.shape[1]
                check_mask(mask, (B, self.num_heads, Tq, cache.room), x.query.device)
        # A KVCache appends this call's keys (a CrossKVCache takes the memory) before the checks
        # that need them (mask shape, structure, the mask_mod's result): a failure undoes that,
        # so a corrected retry attends to them once, not twice.
        points = checkpoints(cache)
        try:
            # (structured self-attention that the tiled backend runs: q, k, v as blocks)
            blocked = (
                structured
                and cache is None
                and self.position is None
                and positions is None
                and x.self_attention
                and self.packed
                and blocked_projection_serves(_sub(self, "in_proj"), x.query)
            )
            q, keys = self._queries_and_keys(x, cache, causal, positions, hooks, blocked)
            if keys.key_slots is not None and structured:
                raise ValueError(SLOTS_REFUSE_STRUCTURE)
            if keys.dropped and structured:  # a window cache: its first key is not token 0
                documents, prefix, mask_mod = structure_after_dropped_keys(
                    documents, prefix, mask_mod, keys.dropped, keys.k.shape[2]
                )
            out, weights = None, None
            if (  # a static cache's one-query step: one operator (attention_plain.py)
                isinstance(cache, StaticKVCache)
                and mask is None
                and not structured
                and hooks is None
                and not return_weights
                and not self._variant
                and not (self.training and self.dropout)
                and (self.position is None or type(self.position).bias is PositionScheme.bias)
            ):
                out = static_row_attention(q, keys, cache)  # (1, H, 1, D) or None
            if out is None:
                B, H, Tq, _ = q.shape
                if mask is not None:  # the user's mask, checked (as every mask is) before combining
                    mask = check_mask(mask, (B, H, Tq, keys.k.shape[2]), q.device)
                if keys.key_mask is not None or keys.mask is not None:
                    key_mask_4d = None if keys.key_mask is None else keys.key_mask[:, None, None, :]
                    mask = combine(mask, keys.mask, key_mask_4d)  # (B, Tk) -> (B, 1, 1, Tk)
                call = make_call(
                    q,
                    keys.k,
                    keys.v,
                    mask=mask,
                    bias=None if self.position is None else position_bias(self.position, Tq, keys),
                    causal=keys.causal,
                    dropout_p=self.dropout if self.training else 0.0,
                    return_weights=return_weights,
                    window=narrowest(window, keys.window),
                    documents=documents,
                    prefix=prefix,
                    mask_mod=mask_mod,
                    block_size=block_size,
                    qkv_checked=True,  # shaped here from checked inputs
                    # (views of the projection that no hook has seen, so none can hold a tensor
                    # hook or a retained gradient the tiled backend's packed gradient would skip)
                    own_views=hooks is None or not any(p in hooks for p in QKV_HOOK_POINTS),
                    **(self._variants() if self._variant else {}),
                )
                out, weights = dispatch(call) if hooks is None else attend(call, hooks)
        except (ValueError, TypeError):
            roll_back(points)
            raise
        # (q, k, v as blocks: the output projection as one too, see `blocked_output`)
        y = blocked_output(self, out) if blocked and hooks is None else self._output(out, hooks)
        if x.unbatched:
            y = y[0]
            weights = None if weights is None else weights[0]
        return (y, weights) if return_weights else y
