"""nn.Modules built on `multihead.functional.attention`."""

from .attention import MultiHeadAttention
from .block import TransformerBlock
from .feedforward import FeedForward, SwiGLU
from .lm import CausalLM, LMConfig
from .norm import RMSNorm
from .stacks import Decoder, Encoder, EncoderDecoder, StackConfig

__all__ = [
    "CausalLM",
    "Decoder",
    "Encoder",
    "EncoderDecoder",
    "FeedForward",
    "LMConfig",
    "MultiHeadAttention",
    "RMSNorm",
    "StackConfig",
    "SwiGLU",
    "TransformerBlock",
]
