"""See what every head does: capture, head gates, metrics, importance and reports."""

from .capture import AttentionRecord, Records, capture
from .gates import head_gates
from .scope import attention_modules

__all__ = ["AttentionRecord", "Records", "attention_modules", "capture", "head_gates"]
