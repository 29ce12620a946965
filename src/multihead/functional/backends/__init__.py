"""Attention backends: `sdpa` (fused, preferred) and `eager` (reference, returns weights)."""

from .eager import eager_attention
from .registry import (
    Backend,
    available_backends,
    get_backend,
    register_backend,
    select_backend,
    unregister_backend,
)
from .sdpa import sdpa_attention, sdpa_why_not

register_backend("eager", eager_attention, priority=0)
register_backend("sdpa", sdpa_attention, why_not=sdpa_why_not, priority=10)

__all__ = [
    "Backend",
    "available_backends",
    "get_backend",
    "register_backend",
    "select_backend",
    "unregister_backend",
]
