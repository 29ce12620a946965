"""summary.json of the demos: plain JSON, the same bytes for the same seed (apart from
`seconds`), so two runs can be compared with `diff`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..atomic import write_text_atomic
from .induction import InductionRun
from .reverse import ReverseRun

DIGITS = 6


def _r(x: float | torch.Tensor) -> float:
    return round(float(x), DIGITS)


def _environment() -> dict[str, Any]:
    return {"torch": torch.__version__, "threads": torch.get_num_threads()}


def induction_summary(run: InductionRun) -> dict[str, Any]:
    final, start = run.final, run.history.scores[0]
    L, H = final.induction.shape
    heads = [
        {
            "layer": layer,
            "head": head,
            "previous_token": _r(final.previous[layer, head]),
            "previous_token_offset": int(final.previous_offset[layer, head]),
            "induction": _r(final.induction[layer, head]),
            "induction_offset": int(final.induction_offset[layer, head]),
            "duplicate": _r(final.duplicate[layer, head]),
            "bos": _r(final.sink[layer, head]),
            "induction_at_start": _r(start.induction[layer, head]),
            "previous_token_at_start": _r(start.previous[layer, head]),
        }
        for layer in range(L)
        for head in range(H)
    ]
    ablation = [
        {"layer": a.layer, "head": a.head, "zero": _r(a.zero), "mean": _r(a.mean)}
        for a in run.ablation
    ]
    history = run.history
    return {
        "command": "induction",
        "config": asdict(run.config),
        "circuit_formed": run.phase.formed,
        "phase_change_step": run.phase.step,
        # the repeated-copy loss's own steepest fall (early on, often the drop from the initial
        # loss that both copies share; the phase change above is measured against the first copy)
        "repeated_loss_steepest_fall_step": run.phase.raw_fall_step,
        "induction_head_formed": run.phase.induction_formed,
        "induction_rise_step": run.phase.induction_step,
        "phase_change_coincides": run.phase.coincides,
        "phase_change_tolerance": run.phase.tolerance,
        "loss_first_copy": _r(final.loss_first),
        "loss_second_copy": _r(final.loss_second),
        "loss_second_copy_at_start": _r(start.loss_second),
        "heads": heads,
        "ablation": ablation,
        "curves": {
            "step": list(history.steps),
            "loss_first_copy": [_r(v) for v in history.curve("loss_first")],
            "loss_second_copy": [_r(v) for v in history.curve("loss_second")],
            # [eval][layer * H + head]
            "induction": [[_r(v) for v in s.induction.flatten().tolist()] for s in history.scores],
            "previous_token": [
                [_r(v) for v in s.previous.flatten().tolist()] for s in history.scores
            ],
        },
        **_environment(),
        "seconds": round(run.seconds, 1),
    }


def reverse_summary(run: ReverseRun) -> dict[str, Any]:
    final = run.final
    L, H = final.alignment.shape
    return {
        "command": "reverse",
        "config": asdict(run.config),
        "accuracy": _r(final.accuracy),
        "sequence_accuracy": _r(final.sequence_accuracy),
        "loss": _r(final.loss),
        "heads": [
            {"layer": layer, "head": head, "alignment": _r(final.alignment[layer, head])}
            for layer in range(L)
            for head in range(H)
        ],
        "curves": {
            "step": list(run.steps),
            "accuracy": [_r(s.accuracy) for s in run.scores],
            "loss": [_r(s.loss) for s in run.scores],
            "alignment": [[_r(v) for v in s.alignment.flatten().tolist()] for s in run.scores],
        },
        **_environment(),
        "seconds": round(run.seconds, 1),
    }


def write_summary(summary: dict[str, Any], path: str | Path) -> None:
    write_text_atomic(path, json.dumps(summary, indent=1) + "\n")
