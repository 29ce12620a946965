"""`MultiheadAttention`: an exact drop-in for torch.nn.MultiheadAttention on multihead's core.

It subclasses torch's module for the parts that must be identical (constructor, parameters and
their names, initialisation, `merge_masks`, the attributes TransformerEncoderLayer's fast path
reads, `isinstance` checks) and replaces `forward`, which runs `multihead.functional.attention`.

Shape legend: B batch, L target length, S source length, E embed_dim, H heads, D head_dim.
Batched inputs are (B, L, E) with batch_first, else (L, B, E); unbatched inputs are (L, E).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.call import make_call
from ..hook_points import ModuleHooks, hooks_for
from ..modules.attend import ATTENTION_HOOK_POINTS, attend, head_results
from ..modules.attention import MultiHeadAttention
from ..modules.projections import PackedWeights, heads_first, project_packed
from . import weights
from .checks import check_forward, check_types
from .mask_rules import multihead_masks, torch_fast_path, uses_causal_hint


class MultiheadAttention(nn.MultiheadAttention):
    """torch.nn.MultiheadAttention with the same constructor, forward, state_dict and attributes.

    Masks keep torch's meaning: a boolean `key_padding_mask` / `attn_mask` is True = blocked, a
    float one is added to the scores; `attn_mask` is (L, S) or (B * H, L, S).

    Deliberate differences from torch:
    - a query row whose keys are all masked gives zeros (output, weights, gradients), not NaN;
    - `need_weights=False` and eval never fall back to a slower path: the default path is one
      fused projection, torch's fused SDPA kernel and the output projection, in any layout;
    - bad input raises ValueError/TypeError naming the argument (torch raises AssertionError or
      RuntimeError); `dropout` must lie in [0, 1).

    It has MultiHeadAttention's hook points (hook_q, hook_k, hook_v, hook_attn_scores,
    hook_pattern, hook_z, hook_result), so `multihead.interpret` sees inside converted models.
    """

    hook_points = ATTENTION_HOOK_POINTS

    def __init__(
        self,
        embed_dim,
        num_heads,
        dropout=0.0,
        bias=True,
        add_bias_kv=False,
        add_zero_attn=False,
        kdim=None,
        vdim=None,
        batch_first=False,
        device=None,
        dtype=None,
    ) -> None:
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
        super().__init__(
            embed_dim,
            num_heads,
            dropout=dropout,
            bias=bias,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            kdim=kdim,
            vdim=vdim,
            batch_first=batch_first,
            device=device,
            dtype=dtype,
        )

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiheadAttention:
        """A drop-in with `module`'s configuration, weights, device, dtype and mode."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(module).__name__}")
        return weights.rebuild(module, cls)

    def to_torch(self) -> nn.MultiheadAttention:
        """A plain torch.nn.MultiheadAttention with this module's configuration and weights."""
        return weights.rebuild(self, nn.MultiheadAttention)

    @classmethod
    def from_modern(
        cls, module: MultiHeadAttention, *, batch_first: bool = True
    ) -> MultiheadAttention:
        """A drop-in holding a `multihead.MultiHeadAttention`'s weights."""
        return weights.from_modern(module, cls, batch_first=batch_first)

    def to_modern(self) -> MultiHeadAttention:
        """This module's weights in a `multihead.MultiHeadAttention` (batch-first)."""
        return weights.to_modern(self)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        hooks = hooks_for(self)
        if (
            not need_weights
            and key_padding_mask is None
            and attn_mask is None
            and not is_causal
            and query is key
            and key is value
            and isinstance(query, Tensor)
            and query.dim() == 3
            and query.shape[-1] == self.embed_dim
            and self._qkv_same_embed_dim
            and self.bias_k is None
            and not self.add_zero_attn
            and hooks is None
        ):
            return self._plain_self_attention(query), None
        # torch's fast path applies attn_mask and ignores is_causal; its standard path trusts
        # the is_causal hint when it can (see mask_rules). Decide as torch would.
        check_types(query, key, value, key_padding_mask, attn_mask)
        fast = torch_fast_path(self, query, key, value, key_padding_mask, attn_mask)
        hint = uses_causal_hint(is_causal, fast, key_padding_mask, need_weights)
        batched = check_forward(
            self,
            query,
            key,
            value,
            key_padding_mask,
            attn_mask,
            mask_required=bool(is_causal) and not fast,
            mask_used=not hint,
        )
        self_attention = query is key and key is value
        if not batched:  # (L, E) -> (1, L, E), handled as batch-first
            query, key, value = query[None], key[None], value[None]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask[None]
        batch_first = self.batch_first or not batched
        L = query.shape[1] if batch_first else query.shape[0]

        q, k, v = self._project(query, key, value, self_attention, batch_first)
        if hooks is not None:
            q, k, v = hooks.heads("hook_q", q), hooks.heads("hook_k", k), hooks.heads("hook_v", v)
        k, v, extra = self._append_extra_keys(k, v)
        mask, bias, causal = multihead_masks(
            key_padding_mask, attn_mask, hint, self.num_heads, L, k.shape[2], extra, q.device
        )
        call = make_call(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            return_weights=bool(need_weights),
            qkv_checked=True,  # shaped here from checked inputs
        )
        out, weights = attend(call, hooks)
        out = self._output(out, batch_first, hooks)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # (B, H, L, S) -> (B, L, S)
        if not batched:
            out = out[0]
            weights = None if weights is None else weights[0]
        return out, weights

    def _plain_self_attention(self, x: Tensor) -> Tensor:
        """The call TransformerEncoderLayer makes (batched self-attention, no mask, no weights)
        with the least Python per call: at small shapes that overhead is most of the time."""
        q, k, v = self._project(x, x, x, True, self.batch_first)
        call = make_call(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, qkv_checked=True
        )
        out, _ = attend(call, None)
        return self._output(out, self.batch_first, None)

    def _output(self, out: Tensor, batch_first: bool, hooks: ModuleHooks | None) -> Tensor:
        """out (B, H, T, D) -> (B, T, E) or (T, B, E) through the output projection."""
        weight, bias = self.out_proj.weight, self.out_proj.bias
        if hooks is not None:
            out = hooks.heads("hook_z", out)
            if "hook_result" in hooks:
                projected = head_results(out, weight, bias, hooks)  # (B, T, E) or None
                if projected is not None:
                    return projected if batch_first else projected.transpose(0, 1)
        B, _, T, _ = out.shape
        if batch_first:  # (B, H, T, D) -> (B, T, E)
            merged = out.transpose(1, 2).reshape(B, T, self.embed_dim)
        else:  # (B, H, T, D) -> (T, B, E)
            merged = out.permute(2, 0, 1, 3).reshape(T, B, self.embed_dim)
        return F.linear(merged, weight, bias)

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, self_attention: bool, batch_first: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs -> q, k, v as (B, H, T, D) views of the projections."""
        w = self.in_proj_weight
        b: Tensor | None = self.in_proj_bias
        weight_dtype = (self.q_proj_weight if w is None else w).dtype
        if b is not None and b.dtype != weight_dtype:
            # A bias of another dtype than the weights: torch's standard path promotes it in the
            # matmul's addition; cast it to the weights' dtype, which gives the same result.
            b = b.to(weight_dtype)
        H = self.num_heads
        if self._qkv_same_embed_dim:
            packed = PackedWeights(w, b, lambda x: F.linear(x, w, b))
            return project_packed(packed, (H, H), query, key, value, self_attention, batch_first)
        bq, bk, bv = (None, None, None) if b is None else b.chunk(3)
        q = F.linear(query, self.q_proj_weight, bq)
        k = F.linear(key, self.k_proj_weight, bk)
        v = F.linear(value, self.v_proj_weight, bv)
        return tuple(heads_first(t, H, batch_first) for t in (q, k, v))  # type: ignore[return-value]

    def _append_extra_keys(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, int]:
        """Append bias_k/bias_v and then a zero key/value, as torch does: (B, H, S', D)."""
        extra = 0
        B, H, _, D = k.shape
        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.view(1, H, 1, D).expand(B, H, 1, D)], dim=2)
            v = torch.cat([v, self.bias_v.view(1, H, 1, D).expand(B, H, 1, D)], dim=2)
            extra += 1
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(B, H, 1, D)], dim=2)
            v = torch.cat([v, v.new_zeros(B, H, 1, D)], dim=2)
            extra += 1
        return k, v, extra
