"""nn.Modules built on `multihead.functional.attention`."""

from .attention import MultiHeadAttention
from .block import TransformerBlock
from .feedforward import FeedForward

__all__ = ["FeedForward", "MultiHeadAttention", "TransformerBlock"]
