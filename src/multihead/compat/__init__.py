"""Compatibility with torch.nn.MultiheadAttention: an exact drop-in and model conversion."""

from .convert import from_modern, from_torch, replace_attention, to_modern, to_torch
from .multihead_attention import MultiheadAttention

__all__ = [
    "MultiheadAttention",
    "from_modern",
    "from_torch",
    "replace_attention",
    "to_modern",
    "to_torch",
]
