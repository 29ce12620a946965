"""Train an encoder-decoder of multihead blocks to reverse random token sequences, and measure
how much of each cross-attention head's weight lands on the aligned source token.

For reversal the true alignment is known: decoder query t (which predicts target token t)
should read source position n - 1 - t, the anti-diagonal. Accuracy is measured by greedy
decoding (the model's own outputs fed back), not teacher forcing.

Shapes: src, tgt (B, S); cross-attention weights per decoder layer (B, H, S, S).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..interpret import capture
from ..interpret.metrics import aligned_mass
from ..modules import EncoderDecoder, StackConfig
from ..modules.init import init_weights
from .checkpoints import Checkpointing, History
from .data import PAD, REVERSE_BOS, ReverseBatch, ReverseTask, reverse_batch
from .loop import HELD_OUT_SEED_OFFSET, check_seed_and_counts, run_steps, seeded


@dataclass(frozen=True)
class ReverseConfig:
    steps: int = 1500
    seed: int = 0
    vocab_size: int = 24
    min_length: int = 6
    max_length: int = 12
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    ffn_dim: int = 128
    # 1/sqrt(dim) rather than the library's GPT-2 default 0.02 (tuned for width 768): at width 64,
    # 0.02 leaves the embeddings 35x smaller than the unit sinusoids added to them and attention
    # near uniform; learning then starts ~700 steps later (measured: docs/training.md).
    init_std: float = 0.125
    lr: float = 3e-3
    weight_decay: float = 0.01
    batch_size: int = 32
    eval_every: int = 100
    held_out: int = 512

    def __post_init__(self) -> None:
        check_seed_and_counts(self, ("steps", "eval_every", "batch_size", "held_out"))

    def task(self) -> ReverseTask:
        return ReverseTask(self.vocab_size, (self.min_length, self.max_length))

    def stack(self) -> StackConfig:
        return StackConfig(
            dim=self.dim, num_layers=self.num_layers, num_heads=self.num_heads, ffn_dim=self.ffn_dim
        )


@dataclass(frozen=True)
class ReverseScores:
    loss: float  # teacher-forced cross-entropy per target token
    accuracy: float  # greedy decoding: share of target tokens right
    sequence_accuracy: float  # greedy decoding: share of sequences entirely right
    alignment: Tensor  # (L, H): mean cross-attention weight on the aligned source token


@dataclass
class ReverseRun:
    config: ReverseConfig
    model: EncoderDecoder
    steps: list[int] = field(default_factory=list)
    scores: list[ReverseScores] = field(default_factory=list)
    held_out: ReverseBatch | None = None
    seconds: float = 0.0

    @property
    def final(self) -> ReverseScores:
        return self.scores[-1]


def reversal_loss(model: EncoderDecoder, batch: ReverseBatch) -> Tensor:
    logits = model(batch.src, batch.tgt_in, src_mask=batch.src_mask)  # (B, S, V)
    return F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD)


def cross_attention(model: EncoderDecoder, batch: ReverseBatch) -> Tensor:
    """(L, B, H, S, S) teacher-forced cross-attention weights of every decoder layer."""
    names = [f"decoder.layers.{i}.cross_attn" for i in range(len(model.decoder.layers))]
    with torch.no_grad(), capture(model, keep_qkv=False) as records:
        model(batch.src, batch.tgt_in, src_mask=batch.src_mask)
    by_name = {r.name: r.weights for r in records}
    return torch.stack([by_name[n] for n in names])


def alignment_scores(weights: Tensor, lengths: Tensor) -> Tensor:
    """(L, H) mean weight on the aligned source token over every real target position of every
    sequence. weights (L, B, H, S, S); sequences of one length share their alignment, so their
    weights are averaged first (the metric is linear in them), then weighted by query count."""
    S = weights.shape[-1]
    total = torch.zeros(weights.shape[0], weights.shape[2], dtype=torch.float64)
    queries = 0
    for n in sorted(set(lengths.tolist())):
        rows = lengths == n
        t = torch.arange(S)
        aligned = torch.where(t < n, n - 1 - t, -1)  # query t reads source n - 1 - t
        total += aligned_mass(weights[:, rows].mean(1), aligned) * n * int(rows.sum())
        queries += n * int(rows.sum())
    return total / queries


@torch.no_grad()
def evaluate(model: EncoderDecoder, batch: ReverseBatch) -> ReverseScores:
    was_training = model.training
    model.eval()
    loss = float(reversal_loss(model, batch))
    S = batch.src.shape[1]
    out = model.greedy(batch.src, REVERSE_BOS, S, src_mask=batch.src_mask)[:, 1:]  # (B, S)
    real = batch.tgt_out != PAD
    right = (out == batch.tgt_out) & real
    accuracy = float(right.sum()) / float(real.sum())
    sequence_accuracy = float((right | ~real).all(-1).double().mean())
    alignment = alignment_scores(cross_attention(model, batch), batch.lengths).float()
    model.train(was_training)
    return ReverseScores(loss, accuracy, sequence_accuracy, alignment)


def train_reverse(
    config: ReverseConfig,
    *,
    progress: Callable[[int], object] | None = None,
    checkpoint: Path | None = None,
    resume: bool = False,
    extend: bool = False,
) -> ReverseRun:
    """Train and measure; `checkpoint` and `resume` as in `train_induction`."""
    start = time.perf_counter()
    task = config.task()
    model = seeded(
        config.seed,
        lambda: init_weights(
            EncoderDecoder(config.vocab_size, config.stack(), config.stack(), init=False),
            std=config.init_std,
        ),
    )
    held_out = reverse_batch(
        task, config.held_out, torch.Generator().manual_seed(config.seed + HELD_OUT_SEED_OFFSET)
    )
    run = ReverseRun(config, model, held_out=held_out)

    def measure_step(step: int) -> dict[str, str]:
        scores = evaluate(model, held_out)
        run.steps.append(step)
        run.scores.append(scores)
        return {
            "loss": f"{scores.loss:.2f}",
            "accuracy": f"{scores.accuracy:.2f}",
            "best alignment": f"{float(scores.alignment.max()):.2f}",
        }

    run_steps(
        model,
        steps=config.steps,
        eval_every=config.eval_every,
        lr=config.lr,
        weight_decay=config.weight_decay,
        seed=config.seed,
        batch_loss=lambda data: reversal_loss(model, reverse_batch(task, config.batch_size, data)),
        evaluate=measure_step,
        progress=progress,
        checkpoint=None
        if checkpoint is None
        else Checkpointing(checkpoint, dataclasses.asdict(config), resume, extend),
        history=History(run.steps, run.scores, ReverseScores),
    )
    run.seconds = time.perf_counter() - start
    return run
