"""Find the phase change in curves recorded during training: pure functions of (steps, values).

The phase change is where the repeated copy's loss falls fastest *relative to the first
copy's*: the in-context gain, loss(first copy) - loss(repeated copy), rises fastest (Olsson et
al.'s in-context learning score). Early in training both losses fall together as the model
learns token frequencies; the gain ignores that. It *coincides* with the rise of the induction
scores when the best head's induction score ends at or above the induction role's threshold
and rises fastest within `tolerance` steps of it. A centred moving average of `window` points
can smooth the curves first; by default (window 1) they are not smoothed: the held-out curves
are averages over hundreds of sequences, and smoothing spreads a jump between two evaluations
into a run of near-equal slopes whose argmax is arbitrary (measured: it moved one RoPE run's
phase change 200 steps away from its induction rise).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..interpret.roles import RULES


def smooth(values: Sequence[float], window: int = 3) -> list[float]:
    """Centred moving average; the ends average over the points that exist."""
    if window < 1:
        raise ValueError(f"window must be a positive int, got {window}")
    half = window // 2
    n = len(values)
    out = []
    for i in range(n):
        part = values[max(0, i - half) : min(n, i + half + 1)]
        out.append(sum(part) / len(part))
    return out


def steepest_change(
    steps: Sequence[int], values: Sequence[float], *, falling: bool, window: int = 1
) -> int | None:
    """The step (midpoint of two evaluations) where the smoothed curve falls (or rises) fastest
    per step; None with fewer than two points."""
    if len(steps) != len(values):
        raise ValueError(f"{len(steps)} steps for {len(values)} values")
    if len(steps) < 2:
        return None
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ValueError("steps must increase")
    v = torch.tensor(smooth(values, window), dtype=torch.float64)
    s = torch.tensor(list(steps), dtype=torch.float64)
    slope = (v[1:] - v[:-1]) / (s[1:] - s[:-1])  # per step
    i = int((slope if not falling else -slope).argmax())
    return int((steps[i] + steps[i + 1]) // 2)


# The repeated copy counts as learned when its loss is at most this share of the first copy's.
FORMED_RATIO = 0.5
# A head counts as an induction head at the induction role's threshold (interpret/roles.py).
INDUCTION_THRESHOLD = next(r.threshold for r in RULES if r.role == "induction")


@dataclass(frozen=True)
class PhaseChange:
    formed: bool  # final repeated-copy loss <= FORMED_RATIO x the first copy's
    step: int | None  # steepest rise of the in-context gain (None when not formed)
    raw_fall_step: int | None  # steepest fall of the repeated-copy loss itself
    induction_formed: bool  # the best head's final induction score >= INDUCTION_THRESHOLD
    induction_step: int | None  # steepest rise of the best head's induction score
    coincides: bool  # both formed and the two steps lie within `tolerance`
    tolerance: int


def detect(
    steps: Sequence[int],
    loss_first: Sequence[float],
    loss_second: Sequence[float],
    best_induction: Sequence[float],
    *,
    tolerance: int,
    window: int = 1,
) -> PhaseChange:
    """The phase change from curves evaluated at `steps`. `best_induction` is, at each step,
    the largest induction score over heads."""
    if not steps:
        raise ValueError("detect needs at least one evaluation")
    if not len(steps) == len(loss_first) == len(loss_second) == len(best_induction):
        raise ValueError("steps, losses and induction scores must have one value per evaluation")
    formed = loss_second[-1] <= FORMED_RATIO * loss_first[-1]
    gain = [f - s for f, s in zip(loss_first, loss_second, strict=True)]
    step = steepest_change(steps, gain, falling=False, window=window) if formed else None
    raw = steepest_change(steps, loss_second, falling=True, window=window)
    induction_formed = best_induction[-1] >= INDUCTION_THRESHOLD
    rise = steepest_change(steps, best_induction, falling=False, window=window)
    coincides = (
        step is not None and induction_formed and rise is not None and abs(step - rise) <= tolerance
    )
    return PhaseChange(formed, step, raw, induction_formed, rise, coincides, tolerance)
