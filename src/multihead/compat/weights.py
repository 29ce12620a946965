"""Weights between torch.nn.MultiheadAttention's layout and multihead's.

All three modules store the same numbers; only names and layout differ:
  torch / drop-in: in_proj_weight (3E, E) or q/k/v_proj_weight, in_proj_bias (3E), out_proj.*
  modern (packed): in_proj.weight (3E, E), in_proj.bias (3E), out_proj.*
  modern (kdim/vdim differ): q_proj / k_proj / v_proj .weight/.bias, out_proj.*

The functions take the class to build as an argument, so this file imports neither the drop-in
nor `convert`: imports flow one way (weights <- multihead_attention <- convert).
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from ..modules import MultiHeadAttention

M = TypeVar("M", bound=nn.Module)
T = TypeVar("T", bound=nn.MultiheadAttention)


def torch_config(module: nn.MultiheadAttention) -> dict:
    """The constructor arguments that rebuild `module` (torch's or the drop-in)."""
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


def rebuild(source: nn.MultiheadAttention, cls: type[T]) -> T:
    """`cls` built with `source`'s configuration, holding its weights, in its train/eval mode."""
    target = cls(**torch_config(source))
    target.load_state_dict(source.state_dict(), strict=True)
    target.train(source.training)
    return target


def to_modern(module: nn.MultiheadAttention) -> MultiHeadAttention:
    """torch's (or the drop-in's) weights in a `multihead.MultiHeadAttention` (batch-first).

    The modern module has no `add_bias_kv` / `add_zero_attn`: those raise ValueError.
    """
    if module.bias_k is not None or module.add_zero_attn:
        raise ValueError(
            "MultiHeadAttention has no add_bias_kv / add_zero_attn; this module uses "
            f"add_bias_kv={module.bias_k is not None}, add_zero_attn={module.add_zero_attn}"
        )
    cfg = torch_config(module)
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


def from_modern(module: MultiHeadAttention, cls: type[T], *, batch_first: bool = True) -> T:
    """A `cls` (torch's module or the drop-in) holding a `multihead.MultiHeadAttention`'s weights.

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
    target = cls(
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
        target.out_proj.weight.copy_(module.out_proj.weight)
        if module.packed:
            target.in_proj_weight.copy_(module.in_proj.weight)
            if bias:
                target.in_proj_bias.copy_(module.in_proj.bias)
                target.out_proj.bias.copy_(module.out_proj.bias)
        else:
            projections = (module.q_proj, module.k_proj, module.v_proj)
            for name, proj in zip("qkv", projections, strict=True):
                getattr(target, f"{name}_proj_weight").copy_(proj.weight)
            if bias:
                target.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
                target.out_proj.bias.copy_(module.out_proj.bias)
    return target.train(module.training)
