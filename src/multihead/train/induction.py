"""Train a small causal model on repeated random segments and watch induction heads form.

Olsson et al. (2022): a 2-layer model that sees text with repeated segments learns in-context
copying in a sudden phase change, as a previous-token head in layer 0 and an induction head in
layer 1 form. Every `eval_every` steps the loop measures held-out losses on both copies and
every head's scores (`probe.measure`); at the end it finds the phase change (`phase.detect`)
and ablates each head (`ablation.ablate_heads`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..modules import CausalLM, LMConfig
from ..modules.init import init_weights
from .ablation import HeadAblation, ablate_heads
from .checkpoints import Checkpointing
from .checkpoints import History as CurveHistory
from .data import RepeatTask, repeat_batch
from .loop import HELD_OUT_SEED_OFFSET, check_seed_and_counts, run_steps, seeded
from .phase import PhaseChange, detect
from .probe import HeldOut, Scores, measure

POSITIONS = ("alibi", "rope", "learned")


@dataclass(frozen=True)
class InductionConfig:
    steps: int = 3000
    seed: int = 0
    position: str = "alibi"
    vocab_size: int = 32
    context: int = 32
    bos: bool = True
    segment: tuple[int, int] = (6, 12)  # lengths of the repeated segment (inclusive)
    gap: tuple[int, int] = (0, 4)  # random tokens between the copies (inclusive)
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    attention_only: bool = True
    # 1/sqrt(dim) rather than the library's GPT-2 default 0.02 (tuned for width 768): at width 64,
    # 0.02 leaves every attention pattern near uniform and the circuit forms later (measured:
    # docs/training.md).
    init_std: float = 0.125
    lr: float = 3e-3
    weight_decay: float = 0.01
    batch_size: int = 32
    eval_every: int = 50
    probe_layouts: int = 16
    probe_per_layout: int = 32

    def __post_init__(self) -> None:
        check_seed_and_counts(
            self, ("steps", "eval_every", "batch_size", "probe_layouts", "probe_per_layout")
        )
        if self.position not in POSITIONS:
            raise ValueError(
                f"--positions must be one of {', '.join(POSITIONS)}, got {self.position!r}"
            )

    def task(self) -> RepeatTask:
        return RepeatTask(
            vocab_size=self.vocab_size,
            context=self.context,
            segment=self.segment,
            gap=self.gap,
            bos=self.bos,
        )

    def model_config(self) -> LMConfig:
        return LMConfig(
            vocab_size=self.vocab_size,
            dim=self.dim,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            max_positions=self.context,
            position=self.position,
            attention_only=self.attention_only,
        )


@dataclass
class History:
    """Curves over training: one entry per evaluation."""

    steps: list[int] = field(default_factory=list)
    scores: list[Scores] = field(default_factory=list)

    def add(self, step: int, scores: Scores) -> None:
        self.steps.append(step)
        self.scores.append(scores)

    def curve(self, name: str) -> list[float]:
        return [float(getattr(s, name)) for s in self.scores]

    def best_induction(self) -> list[float]:
        return [float(s.induction.max()) for s in self.scores]


@dataclass
class InductionRun:
    config: InductionConfig
    model: CausalLM
    history: History
    final: Scores
    phase: PhaseChange
    ablation: list[HeadAblation]
    held_out: HeldOut
    seconds: float


def train_induction(
    config: InductionConfig,
    *,
    progress: Callable[[int], object] | None = None,
    checkpoint: Path | None = None,
    resume: bool = False,
    extend: bool = False,
) -> InductionRun:
    """Train and measure. `progress(total)` may return a tqdm-like bar (update, set_postfix).
    `checkpoint`: a file written (atomically) after each measurement; `resume`: continue from
    it (the result equals an uninterrupted run's); `extend`: resume with more `steps` than the
    checkpoint's run had."""
    start = time.perf_counter()
    task = config.task()
    model = seeded(
        config.seed,
        lambda: init_weights(CausalLM(config.model_config(), init=False), std=config.init_std),
    )
    held_out = HeldOut.make(
        task, config.probe_layouts, config.probe_per_layout, config.seed + HELD_OUT_SEED_OFFSET
    )
    history = History()

    def measure_step(step: int) -> dict[str, str]:
        scores = measure(model, held_out, config.num_layers)
        history.add(step, scores)
        return {
            "loss first": f"{scores.loss_first:.2f}",
            "repeat": f"{scores.loss_second:.2f}",
            "best induction": f"{float(scores.induction.max()):.2f}",
        }

    def batch_loss(data: torch.Generator) -> torch.Tensor:
        batch = repeat_batch(task, config.batch_size, data)
        logits = model(batch.ids)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch.ids[:, 1:].flatten())

    run_steps(
        model,
        steps=config.steps,
        eval_every=config.eval_every,
        lr=config.lr,
        weight_decay=config.weight_decay,
        seed=config.seed,
        batch_loss=batch_loss,
        evaluate=measure_step,
        progress=progress,
        checkpoint=None
        if checkpoint is None
        else Checkpointing(checkpoint, dataclasses.asdict(config), resume, extend),
        history=CurveHistory(history.steps, history.scores, Scores),
    )
    phase = detect(
        history.steps,
        history.curve("loss_first"),
        history.curve("loss_second"),
        history.best_induction(),
        tolerance=max(3 * config.eval_every, config.steps // 20),
    )
    ablation = ablate_heads(model, held_out)
    return InductionRun(
        config,
        model,
        history,
        history.scores[-1],
        phase,
        ablation,
        held_out,
        time.perf_counter() - start,
    )
