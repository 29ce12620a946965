"""Default weight initialisation, kept apart from construction (as torchtitan does).

GPT-2's scheme: every Linear and Embedding weight (and a learned position table) ~ N(0, std),
std 0.02, biases 0, norms at weight 1 / bias 0; the output projection of each residual branch
(attention and cross-attention `out_proj`, MLP `fc2` / SwiGLU `down`) ~ N(0, std / sqrt(n)),
n = the residual branches the stack adds into its stream. For attention + MLP blocks n is
2 x layers, GPT-2's 1/sqrt(2 x layers); a decoder block with cross-attention adds three
branches, an attention-only block one. The stream's variance then does not grow with depth,
and a fresh language model's first loss is about ln(vocab) (torch's N(0, 1) default for an
embedding tied to the output head gives tens of nats).

`CausalLM` and the stacks call `init_weights` at the end of their constructors unless built
with `init=False` (checkpoint loaders: the weights are about to be overwritten anyway).
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch
from torch import nn

from ..positional import LearnedPositions
from .block import TransformerBlock
from .feedforward import FeedForward, SwiGLU
from .norm import RMSNorm

STD = 0.02
Model = TypeVar("Model", bound=nn.Module)


def residual_projections(block: TransformerBlock) -> list[nn.Linear]:
    """The Linear layers whose outputs are added into the residual stream by `block`."""
    out = [block.attn.out_proj]
    if block.cross_attn is not None:
        out.append(block.cross_attn.out_proj)
    if isinstance(block.ffn, FeedForward):
        out.append(block.ffn.fc2)
    elif isinstance(block.ffn, SwiGLU):
        out.append(block.ffn.down)
    return [m for m in out if isinstance(m, nn.Linear)]


@torch.no_grad()
def init_weights(model: Model, *, std: float = STD) -> Model:
    """Initialise `model` in place (GPT-2 style, see the module docstring); returns it.

    Each `nn.ModuleList` of TransformerBlocks is one residual stream: its projections are
    scaled by 1/sqrt(branches in that list). Tied weights are initialised once per owner
    (the same distribution either way).
    """
    if not (isinstance(std, (int, float)) and std > 0):
        raise ValueError(f"std must be a positive number, got {std!r}")
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            bias = getattr(module, "bias", None)
            if bias is not None:
                nn.init.zeros_(bias)
        elif isinstance(module, LearnedPositions):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, (nn.LayerNorm, RMSNorm)):
            if module.weight is not None:
                nn.init.ones_(module.weight)
            bias = getattr(module, "bias", None)
            if bias is not None:
                nn.init.zeros_(bias)
    for stack in model.modules():
        if not isinstance(stack, nn.ModuleList):
            continue
        blocks = [b for b in stack if isinstance(b, TransformerBlock)]
        projections = [p for b in blocks for p in residual_projections(b)]
        for p in projections:
            nn.init.normal_(p.weight, mean=0.0, std=std / math.sqrt(len(projections)))
    return model
