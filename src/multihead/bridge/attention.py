"""multihead's attention as a transformers attention implementation ("multihead").

transformers' attention modules project, rotate and normalise q and k themselves, then call the
function registered under `config._attn_implementation` with
`(module, query, key, value, attention_mask, dropout=..., scaling=..., **extras)` and project
its output. `bridge_attention` is that function: it shows q, k, v to the hook points of the
module (the tensors the registry passes: after RoPE and any q/k norm), runs
`multihead.functional` (the same call construction and backends as native models, with the
`hook_attn_scores` / `hook_pattern` points served by `modules.attend`), shows `hook_z`, and
hands transformers the (B, T, H, D) output it expects.

Masks: "multihead" is registered with transformers' mask interface as SDPA's mask builder, so
`attention_mask` is SDPA's boolean (B, 1, Tq, Tk) mask, True = may attend (multihead's own
convention), or None when the call is plainly causal (or bidirectional) with no padding. A
user's 4-D float mask is additive: it goes in as `bias`.

Extras each model may pass, honoured: `scaling` (scale), `dropout` (on the probabilities; the
models pass 0 in eval), `is_causal`, `sliding_window` (built into the mask by the mask builder;
applied as `window=` when the mask is skipped), `position_bias` (T5: added to the scores),
`softcap` (Gemma 2: tanh-capped scaled scores) and `s_aux` (gpt-oss: per-head sink logits).
Anything else that carries a value and may change the result is refused by name.

Shapes: query (B, H, Tq, D), key / value (B, Hkv, Tk, D) -> output (B, Tq, H, D), weights
(B, H, Tq, Tk) or None.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..functional.attention import dispatch
from ..functional.call import make_call
from ..hook_points import hooks_for
from ..modules.attend import attend

NAME = "multihead"

# Keyword arguments the models pass that do not change attention's result (positions already
# applied to q and k, cache bookkeeping, what to record): read and left alone.
PASS_THROUGH = frozenset(
    {
        "position_ids",
        "cache_position",
        "output_attentions",
        "output_hidden_states",
        "use_cache",
        "past_key_values",
        "past_key_value",
        "layer_idx",
        "return_dict",
        "is_causal",
        "query_length",
        "output_router_logits",
    }
)
# Keys of packed (varlen) batches, as the flash kernels read them: refused when set.
VARLEN = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _weights_wanted(kwargs: dict[str, Any]) -> bool:
    """Whether the caller asked transformers for attention weights (`output_attentions=True`):
    transformers 5 collects them from the attention modules' outputs while its output
    collector (a ContextVar) lists an "*attentions" key; older code passes the flag."""
    if kwargs.get("output_attentions"):
        return True
    try:
        from transformers.utils.output_capturing import _active_collector

        collected = _active_collector.get()
    except (ImportError, LookupError, AttributeError):
        return False
    return bool(collected) and any(str(k).endswith("attentions") for k in collected)


def register() -> None:
    """Register "multihead" with transformers' attention and mask interfaces (idempotent)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        raise ImportError(
            f"multihead's bridge needs transformers >= 5 (its attention and mask registries): "
            f"pip install 'multihead[bridge]' ({e})"
        ) from None

    AttentionInterface.register(NAME, bridge_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def _refuse_unknown(module: nn.Module, kwargs: dict[str, Any]) -> None:
    unknown = sorted(k for k, v in kwargs.items() if v is not None and k not in PASS_THROUGH)
    if unknown:
        what = ", ".join(repr(k) for k in unknown)
        varlen = " (packed sequences: pass a padded batch)" if set(unknown) & set(VARLEN) else ""
        raise ValueError(
            f"{type(module).__name__} passed {what} to the attention function, which the "
            f"multihead bridge does not apply{varlen}; refusing rather than ignoring it"
        )


def _softcap_bias(q: Tensor, k: Tensor, scale: float, softcap: float) -> Tensor:
    """The bias that turns the scaled scores s into softcap * tanh(s / softcap): added to s by
    the attention call, it gives the capped scores (up to one rounding). (B, H, Tq, Tk).
    Where multihead.functional.attention() takes `softcap=` itself (the families-core
    branch), pass it there instead of this bias."""
    groups = q.shape[1] // k.shape[1]
    keys = k.repeat_interleave(groups, dim=1) if groups > 1 else k  # (B, Hkv, ..) -> (B, H, ..)
    s = torch.matmul(q.float(), keys.float().transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
    return (torch.tanh(s / softcap) * softcap - s).to(q.dtype)


def _dense_mask(
    mask: Tensor | None, causal: bool, window: int | None, tq: int, tk: int, device: torch.device
) -> Tensor:
    """(B or 1, 1 or H, Tq, Tk) boolean mask of what a call may attend to, causal bottom-right."""
    if mask is not None:
        return mask
    i = torch.arange(tq, device=device)[:, None] + (tk - tq)  # query i's position among keys
    j = torch.arange(tk, device=device)[None, :]
    allowed = torch.ones(tq, tk, dtype=torch.bool, device=device)
    if causal:
        allowed = allowed & (j <= i)
    if window is not None:
        allowed = allowed & (j > i - window)
    return allowed[None, None]


def _with_sinks(
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    sinks: Tensor,
    causal: bool,
    window: int | None,
    tq: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One more key first, zero key and value, every query may attend to it, biased by the
    head's sink logit: it joins the softmax's denominator and adds nothing to the output (as
    gpt-oss' s_aux). Returns k, v (B, Hkv, 1 + Tk, D), mask and bias (.., Tq, 1 + Tk).
    Where multihead.functional.attention() takes `sinks=` itself (the families-core branch),
    pass it there instead."""
    B, Hkv, Tk, _ = k.shape
    H = sinks.shape[0]
    k = torch.cat([k.new_zeros(B, Hkv, 1, k.shape[-1]), k], dim=2)
    v = torch.cat([v.new_zeros(B, Hkv, 1, v.shape[-1]), v], dim=2)
    allowed = _dense_mask(mask, causal, window, tq, Tk, k.device)
    ones = allowed.new_ones(*allowed.shape[:-1], 1)
    mask = torch.cat([ones, allowed], dim=-1)  # (.., Tq, 1 + Tk)
    column = sinks.to(k.dtype).view(1, H, 1, 1).expand(1, H, tq, 1)
    if bias is None:
        rest = k.new_zeros(1, H, tq, Tk)
    else:
        rest = bias.to(k.dtype).expand(bias.shape[0], H, tq, Tk)
        column = column.expand(rest.shape[0], H, tq, 1)
    return k, v, mask, torch.cat([column, rest], dim=-1)


def bridge_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    position_bias: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """The attention function transformers calls (see the module docstring)."""
    if kwargs:
        _refuse_unknown(module, kwargs)
    tq = query.shape[2]
    mask = bias = None
    causal = False
    window = None
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            mask = attention_mask
        else:  # an additive float mask (a user's own 4-D mask)
            bias = attention_mask.to(query.dtype)
    else:
        # As SDPA's path reads it: the module's own flag unless the call says otherwise.
        wants_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        causal = bool(wants_causal) and tq > 1
        if causal and key.shape[2] > tq:
            # A prefill into an empty static cache (SDPA's path does the same): the keys past
            # the queries are unwritten slots.
            key, value = key[:, :, :tq], value[:, :, :tq]
            if position_bias is not None:
                position_bias = position_bias[..., :tq]
        if sliding_window is not None and causal and key.shape[2] > int(sliding_window):
            window = int(sliding_window)  # (a window as long as the keys changes nothing)
    if position_bias is not None:
        pb = position_bias.to(query.dtype)
        bias = pb if bias is None else bias + pb

    hooks = hooks_for(module)
    if hooks is not None:
        query = hooks.heads("hook_q", query)
        key = hooks.heads("hook_k", key)
        value = hooks.heads("hook_v", value)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    if softcap is not None:
        capped = _softcap_bias(query, key, scale, float(softcap))
        bias = capped if bias is None else bias + capped
    if s_aux is not None:
        key, value, mask, bias = _with_sinks(key, value, mask, bias, s_aux, causal, window, tq)
        causal, window = False, None  # now in the dense mask
    want_weights = _weights_wanted(kwargs)
    call = make_call(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        causal=causal,
        scale=scale,
        dropout_p=float(dropout),
        return_weights=want_weights,
        window=window,
        qkv_checked=True,
    )
    out, weights = dispatch(call) if hooks is None else attend(call, hooks)
    if hooks is not None:
        out = hooks.heads("hook_z", out)
    if weights is not None and s_aux is not None:
        weights = weights[..., 1:]  # the sink's column out, as transformers' eager returns them
    return out.transpose(1, 2), weights  # (B, H, Tq, D) -> (B, Tq, H, D)
