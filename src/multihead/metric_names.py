"""The names of the per-head metrics that `multihead.interpret.metrics` computes (its
`METRIC_NAMES`). Kept apart and free of torch so that the command line can offer them as
choices in `--help` without importing torch."""

from __future__ import annotations

METRIC_NAMES = (
    "previous",
    "next",
    "self",
    "positional",
    "positional_offset",
    "special",
    "punctuation",
    "entropy",
    "entropy_norm",
    "confidence",
    "confidence_content",
    "duplicate",
    "induction",
    "previous_best",
    "previous_distance",
    "induction_best",
    "induction_offset",
)
