"""Confidence for roles measured over several texts: each text's value of a role's metric, and
a bootstrap interval of the mean over texts (or over the probe's trials), so a role is given
only where the interval's low end clears its threshold (`roles.head_roles(intervals=...)`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .metrics import head_metrics, previous_by_distance
from .roles import RULES


def offset_index(chosen: Tensor, offsets: Sequence[int]) -> Tensor:
    """(L, H) offsets -> (L, H) their indices in `offsets`."""
    table = torch.tensor(list(offsets))
    return (chosen.long()[..., None] == table).long().argmax(-1)


def bootstrap_mean_interval(
    values: Tensor, *, resamples: int = 1000, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """95% percentile interval of the mean over the first axis of `values` (N, L, H), the N
    items resampled with replacement (a seeded generator: the same values give the same
    interval): (low, high), each (L, H)."""
    N = values.shape[0]
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, N, (resamples, N), generator=g)
    counts = torch.zeros(resamples, N, dtype=torch.float64)
    counts.scatter_add_(1, picks, torch.ones(resamples, N, dtype=torch.float64))
    means = counts @ values.reshape(N, -1).double() / N  # (R, L*H)
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)
    shape = values.shape[1:]
    return low.reshape(shape).float(), high.reshape(shape).float()


def per_text_values(
    items: Sequence[Any], causal: bool, distances: Sequence[int], metrics: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Each text's value (N, L, H) of the metrics that give text roles; "previous_best" at the
    distance chosen over the corpus (`metrics["previous_distance"]`)."""
    wanted = {r.metric for r in RULES if r.source == "text"} | {"previous"}
    rows: dict[str, list[Tensor]] = {}
    chosen = None
    if "previous_distance" in metrics:
        chosen = offset_index(metrics["previous_distance"], distances)  # (L, H)
    for x in items:
        m = head_metrics(x.attn, x.tokens, causal=causal, sinks=x.sinks or [0])
        for name in wanted & set(m):
            rows.setdefault(name, []).append(m[name].float())
        if chosen is not None:
            scan = previous_by_distance(x.attn, distances)  # (O, L, H)
            rows.setdefault("previous_best", []).append(scan.gather(0, chosen[None])[0].float())
    return {k: torch.stack(v) for k, v in rows.items()}
