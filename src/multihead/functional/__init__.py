"""The functional core: one pure attention function, its masks and its backends."""

from . import masks
from .attention import Explanation, attention, dispatch, explain
from .backends import available_backends, get_backend, register_backend, unregister_backend
from .call import AttentionCall, check_bias, check_mask
from .mask_plan import MaskPlan, block_mask
from .sdpa_compat import scaled_dot_product_attention
from .varlen import VarLen, varlen_attention

__all__ = [
    "AttentionCall",
    "Explanation",
    "MaskPlan",
    "VarLen",
    "attention",
    "available_backends",
    "block_mask",
    "check_bias",
    "check_mask",
    "dispatch",
    "explain",
    "get_backend",
    "masks",
    "register_backend",
    "scaled_dot_product_attention",
    "unregister_backend",
    "varlen_attention",
]
