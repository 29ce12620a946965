"""Periodic training checkpoints, written atomically, and resuming from the last one.

A checkpoint holds everything the rest of the run depends on: the step, the weights, the
optimizer's moments, the training-batch generator's state, the global RNG (dropout), the curves
measured so far, and the run's config (a resumed run must be the same run). Resuming from it
ends with the same weights and measurements as a run that was never interrupted. Files are read
with `torch.load(weights_only=True)`: plain containers and tensors, never arbitrary objects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..atomic import write_atomic

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass(frozen=True)
class Checkpointing:
    """Where the run's checkpoint lives; `resume`: start from it; `config`: the run's settings,
    which a resumed run must share."""

    path: Path
    config: dict
    resume: bool = False


@dataclass
class History:
    """The curves a run measures: one step and one scores dataclass per evaluation (lists the
    caller owns, filled in place)."""

    steps: list[int]
    scores: list[Any]
    score_type: type


def save(
    where: Checkpointing,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: torch.Generator,
    history: History,
) -> None:
    state = {
        "step": step,
        "config": where.config,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data": data.get_state(),
        "rng": torch.get_rng_state(),
        "steps": list(history.steps),
        "scores": [dataclasses.asdict(s) for s in history.scores],
    }
    write_atomic(where.path, lambda f: torch.save(state, f))


def restore(
    where: Checkpointing,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: torch.Generator,
    history: History,
) -> int:
    """Load the checkpoint into the run's objects; the step to continue from. ValueError naming
    the file when it is missing, unreadable, or from a run with other settings."""
    name = str(where.path)
    try:
        state = torch.load(where.path, map_location="cpu", weights_only=True)
        step = state["step"]
        config = state["config"]
    except FileNotFoundError:
        raise ValueError(f"--resume: no checkpoint {name!r} to resume from") from None
    except Exception as e:  # torch raises many types for a bad file
        raise ValueError(f"--resume: cannot read checkpoint {name!r} ({e})") from None
    if config != where.config:
        changed = sorted(k for k in where.config if config.get(k) != where.config[k])
        detail = ", ".join(
            f"{k}: {config.get(k)!r} there, {where.config[k]!r} now" for k in changed
        )
        raise ValueError(
            f"--resume: checkpoint {name!r} was written by a run with other settings ({detail}); "
            "give the same options, or drop --resume to start over"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    data.set_state(state["data"])
    torch.set_rng_state(state["rng"])
    history.steps[:] = state["steps"]
    history.scores[:] = [history.score_type(**s) for s in state["scores"]]
    return int(step)
