"""The HTML report of a trained induction model's heads (`interpret.report_html`): held-out
sequences' attention, causal-aware metrics averaged over them, the run's own induction and
duplicate-token scores, and the measured roles."""

from __future__ import annotations

from pathlib import Path

import torch

from ..interpret import capture
from ..interpret.analysis import Analysis, TextAttention
from ..interpret.metrics import (
    CAUSAL_UNDEFINED,
    INDUCTION_OFFSETS,
    PREVIOUS_DISTANCES,
    corpus_metrics,
)
from ..interpret.roles import head_roles
from .data import BOS
from .induction import InductionRun

# How many held-out sequences the report's text metrics average over.
REPORT_TEXTS = 32
SINK_LABEL = "BOS"


def token_names(ids: list[int], bos: bool) -> list[str]:
    """'<s>' for BOS (a special token to the report), 't7' for content token 7."""
    return ["<s>" if bos and i == BOS else f"t{i}" for i in ids]


def induction_analysis(run: InductionRun) -> Analysis:
    """Attention of held-out sequences (a few of each layout), causal head metrics over them,
    and the run's induction (best offset and +1) and duplicate-token scores, measured on every
    held-out sequence."""
    bos = run.config.bos
    per_layout = min(run.held_out.per_layout, max(1, REPORT_TEXTS // len(run.held_out.layouts)))
    rows = torch.cat(
        [torch.arange(r.start, r.start + per_layout) for r, _ in run.held_out.groups()]
    )[:REPORT_TEXTS]
    ids = run.held_out.batch.ids[rows]
    with torch.no_grad(), capture(run.model, keep_qkv=False) as records:
        run.model(ids)
    weights = torch.stack([r.weights for r in records], dim=1)  # (B, L, H, T, T)
    sinks = [0] if bos else []
    texts = [
        TextAttention(
            token_names(row, bos),
            attn.float(),
            special=[bos and i == 0 for i in range(len(row))],
            sinks=sinks,
        )
        for row, attn in zip(ids.tolist(), weights, strict=True)
    ]
    metrics = corpus_metrics(
        ((t.attn, t.tokens, sinks) for t in texts),
        causal=True,
        previous_distances=PREVIOUS_DISTANCES,
    )
    final = run.final
    metrics["duplicate"] = final.duplicate.double()
    metrics["induction"] = final.induction_scan[INDUCTION_OFFSETS.index(1)].double()
    metrics["induction_best"] = final.induction.double()
    metrics["induction_offset"] = final.induction_offset.double()
    T = ids.shape[1]
    return Analysis(
        texts,
        {k: v.float() for k, v in metrics.items()},
        head_roles(metrics, sinks=SINK_LABEL),
        max_tokens=T,
        kind="causal LM",
        causal=True,
        undefined=dict(CAUSAL_UNDEFINED),
        sink_label=SINK_LABEL,
    )


def write_induction_report(run: InductionRun, path: str | Path) -> None:
    from ..interpret.report_html import write_html

    f, s, n = run.held_out.layouts[0]
    title = (
        f"induction demo ({run.config.position} positions, seed {run.config.seed}): a held-out "
        f"sequence whose {n}-token segment at {f} repeats at {s}"
    )
    write_html(induction_analysis(run), path, title=title)
