"""See what every head does: hook points, caches, patching, capture, head gates, metrics,
importance and reports."""

from .capture import AttentionRecord, Records, capture
from .gates import head_gates
from .hooks import ActivationCache, act_name, hook_names, hooks, run_with_cache, run_with_hooks
from .scope import attention_modules

__all__ = [
    "ActivationCache",
    "AttentionRecord",
    "Records",
    "act_name",
    "attention_modules",
    "capture",
    "head_gates",
    "hook_names",
    "hooks",
    "run_with_cache",
    "run_with_hooks",
]
