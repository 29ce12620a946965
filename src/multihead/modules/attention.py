"""MultiHeadAttention: owns the projections and the reshapes; the math is `functional.attention`.

Shape legend: B batch, Tq/Tk query/key lengths, C embed_dim, H heads, Hkv key/value heads,
D head_dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cache import CrossKVCache, KVCache
from ..functional import AttentionCall, check_mask, dispatch, masks
from ..functional.masks import key_mask_to_mask
from ..functional.varlen import VarLen, varlen_dispatch
from ..positional import ALiBi, RotaryEmbedding


def _apply_linear(layer: nn.Module, x: Tensor) -> Tensor:
    """`layer(x)`, minus Module.__call__ for a plain nn.Linear (whose forward is exactly F.linear).

    That call costs ~7 us, a sixth of the whole layer at small shapes. Layers replaced by another
    type (LoRA, quantized) run their own forward; hooks on a plain nn.Linear projection do not fire.
    """
    if type(layer) is nn.Linear:
        return F.linear(x, layer.weight, layer.bias)
    return layer(x)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class MultiHeadAttention(nn.Module):
    """Multi-head attention with grouped-query support: self or cross, masked, causal.

    Self-attention with `kdim == vdim == embed_dim` uses one packed projection `in_proj`
    (rows ordered q, k, v) and so one fused matmul; otherwise `q_proj`, `k_proj`, `v_proj`.

    Args:
        embed_dim: width C of the query input and of the output.
        num_heads: query heads H.
        num_kv_heads: key/value heads Hkv (must divide H); defaults to H. 1 = multi-query.
        head_dim: width D of each head; defaults to `embed_dim // num_heads`.
        kdim, vdim: widths of the key and value inputs (cross-attention); default `embed_dim`.
        bias: biases on the projections.
        dropout: dropout on the attention probabilities, in training mode only.
        causal: default for `forward(causal=...)`.
        position: a `RotaryEmbedding` (rotates q and k) or an `ALiBi` (adds its bias), applied to
            self-attention; positions continue from a KV cache's length.
    """

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
        dropout: float = 0.0,
        causal: bool = False,
        position: nn.Module | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        embed_dim = _positive_int("embed_dim", embed_dim)
        num_heads = _positive_int("num_heads", num_heads)
        num_kv_heads = _positive_int(
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
        head_dim = _positive_int("head_dim", head_dim)
        kdim = _positive_int("kdim", embed_dim if kdim is None else kdim)
        vdim = _positive_int("vdim", embed_dim if vdim is None else vdim)
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0 <= dropout < 1
        ):
            raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")

        self.embed_dim, self.kdim, self.vdim = embed_dim, kdim, vdim
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dropout = float(dropout)
        self.causal = bool(causal)
        self.packed = kdim == embed_dim and vdim == embed_dim
        q_width, kv_width = num_heads * head_dim, num_kv_heads * head_dim
        factory = {"device": device, "dtype": dtype}
        if self.packed:
            self.in_proj = nn.Linear(embed_dim, q_width + 2 * kv_width, bias=bias, **factory)
        else:
            self.q_proj = nn.Linear(embed_dim, q_width, bias=bias, **factory)
            self.k_proj = nn.Linear(kdim, kv_width, bias=bias, **factory)
            self.v_proj = nn.Linear(vdim, kv_width, bias=bias, **factory)
        self.out_proj = nn.Linear(q_width, embed_dim, bias=bias, **factory)
        self._split = (q_width, kv_width, kv_width)
        self._scale = head_dim**-0.5
        if position is not None and not isinstance(position, (RotaryEmbedding, ALiBi)):
            kind = type(position).__name__
            raise TypeError(f"position must be a RotaryEmbedding, an ALiBi or None, got {kind}")
        if isinstance(position, RotaryEmbedding) and position.head_dim != head_dim:
            raise ValueError(f"RotaryEmbedding head_dim {position.head_dim} != head_dim {head_dim}")
        self.position = position

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"kdim={self.kdim}, vdim={self.vdim}, dropout={self.dropout}, causal={self.causal}"
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
        `positions`: (Tq,) or (B, Tq) positions for RoPE/ALiBi; default: from the cache's length.
        `lengths`: self-attention over packed sequences: `query` is `(N, C)`, the tokens of
        sequences of these lengths one after another (see `functional.varlen`); each attends
        only to itself, with no padding computed, and RoPE/ALiBi positions restart at 0 in
        each. Returns `(N, C)`.

        Returns `(B, Tq, C)`, or `(output, weights (B, H, Tq, Tk))` when `return_weights=True`.
        """
        if lengths is not None:
            unsupported = {
                "key": key,
                "value": value,
                "mask": mask,
                "key_mask": key_mask,
                "cache": cache,
                "positions": positions,
                "return_weights": return_weights or None,
            }
            given = [name for name, arg in unsupported.items() if arg is not None]
            if given:
                raise ValueError(
                    f"{', '.join(given)} cannot be combined with lengths: packed sequences are "
                    "self-attention in which each sequence attends to itself only"
                )
            return self._forward_varlen(query, VarLen.of(lengths), causal)
        if (
            key is None
            and value is None
            and isinstance(query, Tensor)
            and query.dim() == 3
            and query.shape[-1] == self.embed_dim
        ):
            # The hot path (batched self-attention) needs no further checks.
            key = value = query
            self_attention, unbatched = True, False
        else:
            self_attention = key is None or (key is query and (value is None or value is query))
            key = query if key is None else key
            value = key if value is None else value
            unbatched = self._check_inputs(query, key, value)
        if unbatched:
            query, key, value = query[None], key[None], value[None]
            if isinstance(key_mask, Tensor):
                key_mask = key_mask[None]
        bias = None
        if cache is None and self.position is None:
            q, k, v = self._project(query, key, value, self_attention)
        else:
            q, k, v, key_mask, bias, extra_mask = self._positions_and_cache(
                query, key, value, self_attention, key_mask, cache, positions
            )
            mask = (
                extra_mask if mask is None else (mask if extra_mask is None else mask & extra_mask)
            )
        B, H, Tq, _ = q.shape
        if mask is not None:  # user-supplied: checked here, since the call below is trusted
            check_mask(mask, (B, H, Tq, k.shape[2]), q.device)
        if key_mask is not None:
            if not isinstance(key_mask, Tensor) or key_mask.shape != (B, k.shape[2]):
                got = tuple(key_mask.shape) if isinstance(key_mask, Tensor) else key_mask
                raise ValueError(f"key_mask must have shape (B, Tk) = {(B, k.shape[2])}, got {got}")
            key_mask = key_mask_to_mask(key_mask)  # (B, Tk) -> (B, 1, 1, Tk)
            mask = key_mask if mask is None else mask & key_mask
        # q, k, v were shaped here from checked inputs: build the call directly (no re-checks).
        call = AttentionCall(
            q,
            k,
            v,
            mask,
            bias,
            self.causal if causal is None else bool(causal),
            self._scale,
            self.dropout if self.training else 0.0,
            return_weights,
        )
        out, weights = dispatch(call)
        # (B, H, Tq, D) -> (B, Tq, H*D) -> (B, Tq, C)
        out = _apply_linear(self.out_proj, out.transpose(1, 2).reshape(B, Tq, self._split[0]))
        if unbatched:
            out = out[0]
            weights = None if weights is None else weights[0]
        return (out, weights) if return_weights else out

    def _forward_varlen(self, query: Tensor, packed: VarLen, causal: bool | None) -> Tensor:
        """Packed self-attention: query (N, C) -> (N, C). Positions restart at 0 in each
        sequence (RoPE rotates by them; ALiBi biases each run by its own distances)."""
        if not isinstance(query, Tensor) or query.dim() != 2 or query.shape[1] != self.embed_dim:
            got = tuple(query.shape) if isinstance(query, Tensor) else type(query).__name__
            raise ValueError(
                f"with lengths, query must be packed tokens (N, {self.embed_dim}), got {got}"
            )
        if self.kdim != self.embed_dim or self.vdim != self.embed_dim:
            raise ValueError(
                f"lengths need self-attention (kdim == vdim == embed_dim), this module has "
                f"kdim={self.kdim}, vdim={self.vdim}, embed_dim={self.embed_dim}"
            )
        packed.check(query, "query")
        x = query[None]  # (1, N, C): the projections see one long row of tokens
        q, k, v = self._project(x, x, x, True)  # (1, heads, N, D)
        bias = None
        if isinstance(self.position, RotaryEmbedding):
            q, k = self.position(q, k, packed.positions(query.device))
        elif isinstance(self.position, ALiBi):
            alibi = self.position

            def bias(length: int) -> Tensor:  # (1, H, L, L) for one run
                return alibi.bias(length, length, device=query.device).to(query.dtype)

        # (1, heads, N, D) -> (N, heads, D): views
        q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        out = varlen_dispatch(
            q,
            k,
            v,
            packed,
            self.causal if causal is None else bool(causal),
            self._scale,
            dropout,
            bias=bias,
        )
        return _apply_linear(self.out_proj, out.reshape(query.shape[0], self._split[0]))

    def _positions_and_cache(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        self_attention: bool,
        key_mask: Tensor | None,
        cache: KVCache | CrossKVCache | None,
        positions: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """q, k, v after positions and the cache, the key mask over all keys, an additive bias
        (ALiBi) and a mask (sliding window), for calls with a cache or a position module."""
        if isinstance(cache, CrossKVCache):
            if cache.filled:  # the memory was projected at the first call: reuse it
                q = self._heads(self._project_query(query), self.num_heads)
                assert cache.k is not None and cache.v is not None
                return (
                    q,
                    cache.k,
                    cache.v,
                    cache.key_mask if key_mask is None else key_mask,
                    None,
                    None,
                )
            q, k, v = self._project(query, key, value, self_attention)
            cache.k, cache.v, cache.key_mask = k, v, key_mask
            return q, k, v, key_mask, None, None
        q, k, v = self._project(query, key, value, self_attention)
        Tq = q.shape[2]
        start = cache.length if isinstance(cache, KVCache) else 0
        if isinstance(self.position, RotaryEmbedding):
            if not self_attention:
                raise ValueError("RoPE applies to self-attention; this call attends to other keys")
            if positions is None:
                positions = torch.arange(start, start + Tq, device=q.device)
            q, k = self.position(q, k, positions)
        extra_mask = None
        if isinstance(cache, KVCache):
            if key_mask is not None and key_mask.shape != (q.shape[0], Tq):
                raise ValueError(
                    f"with a cache, key_mask covers this call's tokens: (B, T) = "
                    f"{(q.shape[0], Tq)}, got {tuple(key_mask.shape)}"
                )
            k, v, key_mask = cache.update(k, v, key_mask)
            if cache.window is not None:
                extra_mask = masks.sliding_window(Tq, k.shape[2], cache.window, device=q.device)
        bias = None
        if isinstance(self.position, ALiBi):
            bias = self.position.bias(Tq, k.shape[2], device=q.device).to(q.dtype)
        return q, k, v, key_mask, bias, extra_mask

    def _project_query(self, query: Tensor) -> Tensor:
        if not self.packed:
            return _apply_linear(self.q_proj, query)
        bias = self.in_proj.bias
        q_width = self._split[0]
        return F.linear(
            query, self.in_proj.weight[:q_width], None if bias is None else bias[:q_width]
        )

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> bool:
        for name, t, width in (
            ("query", query, self.embed_dim),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() not in (2, 3) or t.shape[-1] != width:
                raise ValueError(
                    f"{name} must have shape (B, T, {width}) or (T, {width}), got {tuple(t.shape)}"
                )
        if not query.dim() == key.dim() == value.dim():
            raise ValueError(
                f"query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                f"{tuple(value.shape)} must all be batched (3-D) or all unbatched (2-D)"
            )
        if query.dim() == 3 and not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"batch sizes differ: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                f"value {tuple(value.shape)}"
            )
        if key.shape[-2] != value.shape[-2]:
            raise ValueError(
                f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the same length"
            )
        return query.dim() == 2

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, heads, self.head_dim).transpose(1, 2)  # (B, T, n*D) -> (B, n, T, D)

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, self_attention: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs -> q (B, H, Tq, D), k and v (B, Hkv, Tk, D)."""
        H, Hkv = self.num_heads, self.num_kv_heads
        if not self.packed:
            return (
                self._heads(_apply_linear(self.q_proj, query), H),
                self._heads(_apply_linear(self.k_proj, key), Hkv),
                self._heads(_apply_linear(self.v_proj, value), Hkv),
            )
        if self_attention:
            qkv = _apply_linear(self.in_proj, query)  # (B, T, (H + 2 Hkv) D): one fused matmul
            if H == Hkv:
                B, T, _ = qkv.shape
                # (B, T, 3 H D) -> (3, B, H, T, D): one view, one permute, no copy
                q, k, v = qkv.view(B, T, 3, H, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
                return q, k, v
            q, k, v = qkv.split(self._split, dim=-1)
            return self._heads(q, H), self._heads(k, Hkv), self._heads(v, Hkv)
        # Cross-attention with the packed layout: slices of the packed weight (views, no copy).
        weight, bias = self.in_proj.weight, self.in_proj.bias
        q_width = self._split[0]
        _, kw, vw = weight.split(self._split)
        _, kb, vb = (None, None, None) if bias is None else bias.split(self._split)
        q = self._project_query(query)
        if key is value:
            # The k and v rows are adjacent in the packed weight: one matmul for both.
            kv_bias = None if bias is None else bias[q_width:]
            k, v = F.linear(key, weight[q_width:], kv_bias).chunk(2, dim=-1)
        else:
            k, v = F.linear(key, kw, kb), F.linear(value, vw, vb)
        return self._heads(q, H), self._heads(k, Hkv), self._heads(v, Hkv)
