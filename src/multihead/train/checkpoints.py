"""Periodic training checkpoints, written atomically, and resuming from the last one.

A checkpoint holds everything the rest of the run depends on: the step, the weights, the
optimizer's moments, the training-batch generator's state, the global RNG (dropout), the curves
measured so far, and the run's config (a resumed run must be the same run). Resuming from it
ends with the same weights and measurements as a run that was never interrupted. Files are read
with `torch.load(weights_only=True)`: plain containers and tensors, never arbitrary objects.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..atomic import write_atomic

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass(frozen=True)
class Checkpointing:
    """Where the run's checkpoint lives; `resume`: start from it; `config`: the run's settings,
    which a resumed run must share; `extend`: a resumed run may have more `steps` than the run
    that wrote the checkpoint (and train on past where that one stopped)."""

    path: Path
    config: dict
    resume: bool = False
    extend: bool = False


@dataclass
class History:
    """The curves a run measures: one step and one scores dataclass per evaluation (lists the
    caller owns, filled in place)."""

    steps: list[int]
    scores: list[Any]
    score_type: type


_FIELDS = ("step", "config", "model", "optimizer", "data", "rng", "steps", "scores")


def state_digest(state: dict) -> str:
    """SHA-256 of everything a checkpoint holds but its digest: tensors by dtype, shape and
    bytes, containers and scalars by type and value (in order). A flipped byte anywhere in the
    values changes it."""
    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            h.update(f"D{len(x)}".encode())
            for k, v in x.items():
                feed(k)
                feed(v)
        elif isinstance(x, (list, tuple)):
            h.update(f"{type(x).__name__[0]}{len(x)}".encode())
            for v in x:
                feed(v)
        elif x is None or isinstance(x, (bool, int, float, str)):
            h.update(f"{type(x).__name__}:{x!r};".encode())
        else:
            raise TypeError(f"a checkpoint cannot hold {type(x).__name__}")

    feed({k: state[k] for k in _FIELDS})
    return h.hexdigest()


def save(
    where: Checkpointing,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: torch.Generator,
    history: History,
) -> None:
    state: dict[str, Any] = {
        "step": step,
        "config": where.config,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data": data.get_state(),
        "rng": torch.get_rng_state(),
        "steps": list(history.steps),
        "scores": [dataclasses.asdict(s) for s in history.scores],
    }
    state["sha256"] = state_digest(state)
    write_atomic(where.path, lambda f: torch.save(state, f))


def restore(
    where: Checkpointing,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: torch.Generator,
    history: History,
    *,
    steps: int,
) -> int:
    """Load the checkpoint into the run's objects; the step to continue from. Every field is
    checked (the digest, then each against this run's objects and settings) before any is
    loaded: ValueError starting '--resume:' and naming the file when it is missing,
    unreadable, damaged, from a run with other settings, or already at `steps`."""
    name = str(where.path)
    try:
        state = torch.load(where.path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"--resume: no checkpoint {name!r} to resume from") from None
    except Exception as e:  # torch raises many types for a bad file
        raise ValueError(f"--resume: cannot read checkpoint {name!r} ({e})") from None

    def bad(detail: str) -> ValueError:
        return ValueError(f"--resume: checkpoint {name!r} {detail}")

    if not isinstance(state, dict):
        raise bad(f"holds a {type(state).__name__}, not a training checkpoint")
    missing = [k for k in (*_FIELDS, "sha256") if k not in state]
    if missing:
        raise bad(f"lacks {', '.join(missing)} (not written by this version of multihead?)")
    try:
        digest = state_digest(state)
    except TypeError as e:
        raise bad(f"is damaged ({e})") from None
    if digest != state["sha256"]:
        raise bad("is damaged: its contents do not match the SHA-256 digest written with them")
    _check_config(state["config"], where, bad)
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad(f"holds step {step!r}, not a step count")
    if step >= steps:
        finished = "it is finished; " if step == steps and not where.extend else ""
        raise bad(
            f"is at step {step}, and this run has --steps {steps}: {finished}give a --steps "
            f"above {step} with --extend to train on"
        )
    _check_model(state["model"], model, bad)
    _check_optimizer(state["optimizer"], optimizer, bad)
    for key, now in (("data", data.get_state()), ("rng", torch.get_rng_state())):
        _check_like(state[key], now, f"{key} (the random generator's state)", bad)
    _check_history(state["steps"], state["scores"], step, history.score_type, bad)
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        data.set_state(state["data"])
        torch.set_rng_state(state["rng"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise bad(f"does not fit this run ({' '.join(str(e).split())})") from None
    history.steps[:] = state["steps"]
    history.scores[:] = [history.score_type(**s) for s in state["scores"]]
    return step


def _check_config(config: object, where: Checkpointing, bad: Callable[[str], Exception]) -> None:
    if not isinstance(config, dict):
        raise bad(f"holds config {config!r}, not a dict of settings")
    ignored = {"steps"} if where.extend else set()
    keys = (set(config) | set(where.config)) - ignored
    changed = sorted(k for k in keys if config.get(k) != where.config.get(k))
    if changed:
        detail = ", ".join(
            f"{k}: {config.get(k)!r} there, {where.config.get(k)!r} now" for k in changed
        )
        raise bad(
            f"was written by a run with other settings ({detail}); give the same options, "
            "or drop --resume to start over"
        )


def _check_like(value: object, like: Tensor, what: str, bad: Callable[[str], Exception]) -> None:
    if not isinstance(value, Tensor):
        raise bad(f"holds {what} as {type(value).__name__}, not a tensor")
    if value.dtype != like.dtype or value.shape != like.shape:
        raise bad(
            f"holds {what} as {value.dtype} {tuple(value.shape)}; this run has "
            f"{like.dtype} {tuple(like.shape)}"
        )


def _check_model(saved: object, model: nn.Module, bad: Callable[[str], Exception]) -> None:
    if not isinstance(saved, dict):
        raise bad(f"holds model weights as {type(saved).__name__}, not a state dict")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    if missing or extra:
        raise bad(f"does not fit the model: missing weights {missing}, unexpected {extra}")
    for key, tensor in expected.items():
        _check_like(saved[key], tensor, f"weight {key!r}", bad)


def _check_optimizer(
    saved: object, optimizer: torch.optim.Optimizer, bad: Callable[[str], Exception]
) -> None:
    if not isinstance(saved, dict) or not {"state", "param_groups"} <= set(saved):
        raise bad("holds no optimizer state (state and param_groups)")
    groups, now = saved["param_groups"], optimizer.state_dict()["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(now):
        raise bad(f"holds {groups!r} as the optimizer's parameter groups; this run has {len(now)}")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for old, new in zip(groups, now, strict=True):
        if not isinstance(old, dict) or old.get("params") != new["params"]:
            raise bad("holds optimizer parameter groups that do not match the model's parameters")
        for key in ("lr", "weight_decay", "betas", "eps"):
            if old.get(key) != new[key]:
                raise bad(f"holds optimizer {key} {old.get(key)!r}; this run has {new[key]!r}")
    state = saved["state"]
    if not isinstance(state, dict) or not set(state) <= set(range(len(params))):
        raise bad("holds optimizer state for parameters the model does not have")
    for index, entry in state.items():
        if not isinstance(entry, dict) or not {"step", "exp_avg", "exp_avg_sq"} <= set(entry):
            raise bad(f"holds incomplete optimizer state for parameter {index}")
        for key in ("exp_avg", "exp_avg_sq"):
            _check_like(entry[key], params[index].detach(), f"optimizer {key}[{index}]", bad)
        if bool((entry["exp_avg_sq"] < 0).any()):
            raise bad(f"holds negative optimizer exp_avg_sq[{index}] (squares are never < 0)")


def _check_history(
    steps: object, scores: object, step: int, score_type: type, bad: Callable[[str], Exception]
) -> None:
    if not (
        isinstance(steps, list)
        and all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
        and steps == sorted(set(steps))
        and (not steps or steps[-1] == step)
    ):
        raise bad(f"holds measured steps {steps!r}, not rising to its step {step}")
    if not isinstance(scores, list) or len(scores) != len(steps):
        raise bad("holds a different number of measurements and measured steps")
    names = {f.name for f in dataclasses.fields(score_type)}
    for s in scores:
        if not isinstance(s, dict) or set(s) != names:
            raise bad(f"holds a measurement {s!r}; this run measures {sorted(names)}")
