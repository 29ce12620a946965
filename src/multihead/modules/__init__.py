"""nn.Modules built on `multihead.functional.attention`."""

from .attention import MultiHeadAttention

__all__ = ["MultiHeadAttention"]
