"""Conversions: torch.nn.MultiheadAttention <-> the drop-in <-> multihead.MultiHeadAttention.

All three store the same numbers; only names and layout differ:
  torch / drop-in: in_proj_weight (3E, E) or q/k/v_proj_weight, in_proj_bias (3E), out_proj.*
  modern (packed): in_proj.weight (3E, E), in_proj.bias (3E), out_proj.*
  modern (kdim/vdim differ): q_proj / k_proj / v_proj .weight/.bias, out_proj.*
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from ..modules import MultiHeadAttention
from .encoder_layer import keep_attention_running
from .multihead_attention import MultiheadAttention


def _config(module: nn.MultiheadAttention) -> dict:
    p = next(module.parameters())
    return dict(
        embed_dim=module.embed_dim,
        num_heads=module.num_heads,
        dropout=module.dropout,
        bias=module.in_proj_bias is not None,
        add_bias_kv=module.bias_k is not None,
        add_zero_attn=module.add_zero_attn,
        kdim=module.kdim,
        vdim=module.vdim,
        batch_first=module.batch_first,
        device=p.device,
        dtype=p.dtype,
    )


M = TypeVar("M", bound=nn.Module)


def _copy(source: nn.Module, target: M) -> M:
    target.load_state_dict(source.state_dict(), strict=True)
    target.train(source.training)
    return target


def from_torch(module: nn.MultiheadAttention) -> MultiheadAttention:
    """A drop-in with the same configuration, weights, device, dtype and train/eval mode."""
    if not isinstance(module, nn.MultiheadAttention):
        raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(module).__name__}")
    return _copy(module, MultiheadAttention(**_config(module)))


def to_torch(module: MultiheadAttention) -> nn.MultiheadAttention:
    """A plain torch.nn.MultiheadAttention with the same configuration and weights."""
    return _copy(module, nn.MultiheadAttention(**_config(module)))


def to_modern(module: nn.MultiheadAttention) -> MultiHeadAttention:
    """torch's (or the drop-in's) weights in a `multihead.MultiHeadAttention` (batch-first).

    The modern module has no `add_bias_kv` / `add_zero_attn`: those raise ValueError.
    """
    if module.bias_k is not None or module.add_zero_attn:
        raise ValueError(
            "MultiHeadAttention has no add_bias_kv / add_zero_attn; this module uses "
            f"add_bias_kv={module.bias_k is not None}, add_zero_attn={module.add_zero_attn}"
        )
    cfg = _config(module)
    modern = MultiHeadAttention(
        module.embed_dim,
        module.num_heads,
        kdim=module.kdim,
        vdim=module.vdim,
        bias=cfg["bias"],
        dropout=module.dropout,
        device=cfg["device"],
        dtype=cfg["dtype"],
    )
    state = {"out_proj.weight": module.out_proj.weight}
    if cfg["bias"]:
        state["out_proj.bias"] = module.out_proj.bias
    if modern.packed:
        state["in_proj.weight"] = module.in_proj_weight
        if cfg["bias"]:
            state["in_proj.bias"] = module.in_proj_bias
    else:
        biases = module.in_proj_bias.chunk(3) if cfg["bias"] else (None,) * 3
        for name, bias in zip("qkv", biases, strict=True):
            state[f"{name}_proj.weight"] = getattr(module, f"{name}_proj_weight")
            if bias is not None:
                state[f"{name}_proj.bias"] = bias
    modern.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)
    return modern.train(module.training)


def from_modern(module: MultiHeadAttention, *, batch_first: bool = True) -> MultiheadAttention:
    """A drop-in holding a `multihead.MultiHeadAttention`'s weights.

    Needs what torch's layout can express: num_kv_heads == num_heads, head_dim * num_heads ==
    embed_dim, and biases on all projections or none.
    """
    E, H = module.embed_dim, module.num_heads
    if module.num_kv_heads != H or module.head_dim * H != E:
        raise ValueError(
            "torch's layout needs num_kv_heads == num_heads and head_dim * num_heads == "
            f"embed_dim; got num_heads={H}, num_kv_heads={module.num_kv_heads}, "
            f"head_dim={module.head_dim}, embed_dim={E}"
        )
    bias = module.out_proj.bias is not None
    p = module.out_proj.weight
    drop_in = MultiheadAttention(
        E,
        H,
        dropout=module.dropout,
        bias=bias,
        kdim=module.kdim,
        vdim=module.vdim,
        batch_first=batch_first,
        device=p.device,
        dtype=p.dtype,
    )
    with torch.no_grad():
        drop_in.out_proj.weight.copy_(module.out_proj.weight)
        if module.packed:
            drop_in.in_proj_weight.copy_(module.in_proj.weight)
            if bias:
                drop_in.in_proj_bias.copy_(module.in_proj.bias)
                drop_in.out_proj.bias.copy_(module.out_proj.bias)
        else:
            projections = (module.q_proj, module.k_proj, module.v_proj)
            for name, proj in zip("qkv", projections, strict=True):
                getattr(drop_in, f"{name}_proj_weight").copy_(proj.weight)
            if bias:
                drop_in.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
                drop_in.out_proj.bias.copy_(module.out_proj.bias)
    return drop_in.train(module.training)


def replace_attention(model: nn.Module) -> nn.Module:
    """Swap every torch.nn.MultiheadAttention inside `model` for the drop-in, in place.

    Weights, device, dtype and mode carry over, so the model's outputs are unchanged. torch's
    encoder layers and encoders are switched (in place) to always call their attention module:
    their fused eval fast path would bypass the drop-in (see `encoder_layer`). Returns
    `model` (or, when `model` itself is a torch.nn.MultiheadAttention, its drop-in).
    """
    if type(model) is nn.MultiheadAttention:
        return from_torch(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.MultiheadAttention:
                setattr(parent, name, from_torch(child))
    keep_attention_running(model)
    return model
