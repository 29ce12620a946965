"""The check every intervention makes on its metric before reporting fractions of it.

An intervention's result is relative to the metric on the clean and corrupted runs:
(metric(patched) - corrupted) / (clean - corrupted). That is meaningless when either value is
NaN or infinite (every fraction would be NaN) or when the two are equal (nothing to recover), so
both are refused with one error naming the run and the value.
"""

from __future__ import annotations

import math


def check_metric_pair(clean: float, corrupted: float) -> float:
    """`clean - corrupted`, the denominator of every fraction recovered; ValueError when either
    value is NaN or infinite, or when they are equal."""
    for run, value in (("clean", clean), ("corrupted", corrupted)):
        if not math.isfinite(value):
            raise ValueError(
                f"the metric is {value} on the {run} run: fractions of it would be meaningless "
                "(check the metric and the model's output for NaN or infinite values)"
            )
    difference = clean - corrupted
    if difference == 0:
        raise ValueError(
            f"the metric is {clean} on both the clean and the corrupted input: "
            "there is no difference to recover"
        )
    return difference
