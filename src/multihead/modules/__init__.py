"""nn.Modules built on `multihead.functional.attention`."""

from .attention import MultiHeadAttention
from .block import TransformerBlock
from .cache import CrossKVCache, KVCache
from .feedforward import FeedForward, SwiGLU
from .lm import CausalLM, LMConfig
from .norm import RMSNorm
from .stacks import Decoder, Encoder, EncoderDecoder, StackConfig
from .static_cache import StaticKVCache

__all__ = [
    "CausalLM",
    "CrossKVCache",
    "Decoder",
    "Encoder",
    "EncoderDecoder",
    "FeedForward",
    "KVCache",
    "LMConfig",
    "MultiHeadAttention",
    "RMSNorm",
    "StackConfig",
    "StaticKVCache",
    "SwiGLU",
    "TransformerBlock",
]
