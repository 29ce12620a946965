"""Attention backends: `sdpa` (fused, preferred), `eager` (reference, returns weights) and
`tiled` (structured calls: windows, documents, prefixes at the cost of their pairs, on CPU) and
`flex` (torch's flex_attention with a BlockMask: structured calls on CUDA)."""

from .eager import eager_attention
from .flex import flex_prefer, flex_run, flex_why_not
from .registry import (
    Backend,
    available_backends,
    first_plain_backend,
    get_backend,
    register_backend,
    select_backend,
    unregister_backend,
)
from .sdpa import sdpa_attention, sdpa_why_not
from .tiled import tiled_attention, tiled_prefer, tiled_why_not

register_backend("eager", eager_attention, priority=0)
# (kept: `functional.attention.dispatch_plain` runs its plain kernel call directly while it is
# the backend auto asks first about plain calls)
SDPA_BACKEND = register_backend("sdpa", sdpa_attention, why_not=sdpa_why_not, priority=10)
register_backend(
    "tiled",
    tiled_attention,
    why_not=tiled_why_not,
    priority=20,
    structured=True,
    prefer=tiled_prefer,
    structure_only=True,
)
register_backend(
    "flex",
    flex_run,
    why_not=flex_why_not,
    priority=15,
    structured=True,
    prefer=flex_prefer,
    structure_only=True,
)

__all__ = [
    "Backend",
    "available_backends",
    "first_plain_backend",
    "get_backend",
    "register_backend",
    "select_backend",
    "unregister_backend",
]
