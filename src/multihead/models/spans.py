"""Byte spans of tensors in a checkpoint file (torch-free: the GGUF reader and the
safetensors header check share it)."""

from __future__ import annotations


def first_overlap(spans: dict[str, tuple[int, int]]) -> tuple[str, str] | None:
    """Two tensors whose byte spans [begin, end) share a byte (the earlier first), or None.
    Empty spans share nothing. Sorted once: O(n log n)."""
    ordered = sorted(
        ((begin, end, name) for name, (begin, end) in spans.items() if end > begin),
    )
    furthest, owner = -1, ""
    for begin, end, name in ordered:
        if begin < furthest:
            return owner, name
        if end > furthest:
            furthest, owner = end, name
    return None
