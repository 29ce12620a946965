"""multihead: multi-head attention for PyTorch, correct, fast and inspectable."""

from . import functional
from .functional import attention, scaled_dot_product_attention
from .modules import MultiHeadAttention

__version__ = "0.1.0"

__all__ = [
    "MultiHeadAttention",
    "__version__",
    "attention",
    "functional",
    "scaled_dot_product_attention",
]
