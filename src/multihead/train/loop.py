"""What both training demos share: config checks, seeded weights, and the loop (AdamW steps on
fresh batches, a measurement every `eval_every` steps and after the last, a progress bar).

Random streams, in the order the demos draw from them: the initial weights from `seed` in a
forked RNG (the caller's global state is left alone); training batches from a generator seeded
with `seed`; held-out data from its own generator, seeded with `seed + HELD_OUT_SEED_OFFSET`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import torch
from torch import Tensor, nn

from . import checkpoints
from .checkpoints import Checkpointing, History

# Held-out sequences come from their own seed stream, apart from the training batches.
HELD_OUT_SEED_OFFSET = 1_000_003

M = TypeVar("M", bound=nn.Module)


class SeededConfig(Protocol):
    @property
    def seed(self) -> int: ...


def check_seed_and_counts(config: SeededConfig, counts: tuple[str, ...]) -> None:
    """`seed` a non-negative int and each of `counts` a positive int, in the options' words."""
    seed = config.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {seed!r}")
    for name in counts:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"--{name.replace('_', '-')} must be a positive integer, got {value!r}"
            )


def seeded(seed: int, build: Callable[[], M]) -> M:
    """`build()` with the global RNG seeded by `seed` inside a fork: the initial weights depend
    on the seed alone, and the caller's RNG state is untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def run_steps(
    model: nn.Module,
    *,
    steps: int,
    eval_every: int,
    lr: float,
    weight_decay: float,
    seed: int,
    batch_loss: Callable[[torch.Generator], Tensor],
    evaluate: Callable[[int], dict[str, str]],
    progress: Callable[[int], object] | None,
    checkpoint: Checkpointing | None = None,
    history: History | None = None,
) -> None:
    """Train `model` for `steps` AdamW steps on `batch_loss(data)` (data: the training-batch
    generator, seeded with `seed`). `evaluate(step)` runs at step 0, every `eval_every` steps
    and after the last; it returns the progress bar's fields, in display order. `progress(total)`
    may return a tqdm-like bar (update, set_postfix, close). With `checkpoint` (and the
    `history` evaluate fills), a checkpoint is written atomically after each evaluation, and
    `checkpoint.resume` continues from the last one. Leaves the model in eval mode."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    data = torch.Generator().manual_seed(seed)
    if checkpoint is not None and history is None:
        raise ValueError("checkpointing needs the run's history")
    start = 0
    if checkpoint is not None and checkpoint.resume:
        assert history is not None
        start = checkpoints.restore(checkpoint, model, opt, data, history, steps=steps)
    bar = progress(steps) if progress is not None else None
    if bar is not None and start:
        bar.update(start)  # type: ignore[attr-defined]
    model.train()
    for step in range(start, steps + 1):
        resumed_here = checkpoint is not None and checkpoint.resume and step == start
        if (step % eval_every == 0 or step == steps) and not resumed_here:
            fields = evaluate(step)  # (a resumed run measured this step before it stopped)
            if bar is not None:  # a dict keeps the order (keyword arguments would be sorted)
                bar.set_postfix(fields, refresh=False)  # type: ignore[attr-defined]
            if checkpoint is not None:
                assert history is not None
                checkpoints.save(checkpoint, step, model, opt, data, history)
        if step == steps:
            break
        loss = batch_loss(data)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if bar is not None:
            bar.update(1)  # type: ignore[attr-defined]
    if bar is not None:
        bar.close()  # type: ignore[attr-defined]
    model.eval()
