"""Quantized weights as a storage form: packed matrices behind nn.Linear's and nn.Embedding's
interfaces (linear.py), and the products that read them as stored (kernels.py)."""

from .kernels import KERNEL_MAX_ROWS, kernels_available
from .linear import (
    PackedRows,
    QuantizedEmbedding,
    QuantizedLinear,
    is_quantized,
    linear_pair,
    weight_like,
)

__all__ = [
    "KERNEL_MAX_ROWS",
    "PackedRows",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "is_quantized",
    "kernels_available",
    "linear_pair",
    "weight_like",
]
