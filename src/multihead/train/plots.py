"""Figures of the training demos, with matplotlib (an optional extra, imported here only).

Figures are built with `matplotlib.figure.Figure` directly, not pyplot: no global figure
registry and no backend switch, so plotting leaves the process as it found it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..atomic import save_figure

if TYPE_CHECKING:
    from .induction import InductionRun
    from .reverse import ReverseRun

MISSING = "the figures need matplotlib: pip install 'multihead[report]'"


def require_matplotlib() -> None:
    """Raise ImportError with the install hint when matplotlib is missing."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        raise ImportError(MISSING) from None


def _figure(width: float, height: float):
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _mark_phase(ax, step: int | None) -> None:
    if step is not None:
        ax.axvline(step, color="0.3", linestyle="--", linewidth=1)


def induction_png(run: InductionRun, path: str | Path) -> None:
    """Four panels: loss on each copy; induction and previous-token scores of every head over
    training (the phase change dashed); the repeated-copy loss with each head ablated."""
    steps = run.history.steps
    scores = run.history.scores
    L, H = scores[-1].induction.shape
    fig = _figure(11, 7.5)
    (loss_ax, ind_ax), (prev_ax, abl_ax) = fig.subplots(2, 2)
    loss_ax.plot(steps, run.history.curve("loss_first"), label="first copy (unpredictable)")
    loss_ax.plot(steps, run.history.curve("loss_second"), label="repeated copy")
    loss_ax.set(xlabel="step", ylabel="held-out loss (nats/token)", title="loss on each copy")
    step = run.phase.step
    _mark_phase(loss_ax, step)
    if step is not None:
        loss_ax.annotate(
            f"phase change ~{step}", (step, loss_ax.get_ylim()[1]), ha="left", va="top", fontsize=8
        )
    loss_ax.legend(fontsize=8)
    colors = [f"C{h}" for h in range(H)]
    for ax, name, title in (
        (ind_ax, "induction", "induction score (best offset), per head"),
        (prev_ax, "previous", "previous-token score (best distance), per head"),
    ):
        for layer in range(L):
            for head in range(H):
                values = [float(getattr(s, name)[layer, head]) for s in scores]
                ax.plot(
                    steps,
                    values,
                    color=colors[head],
                    linestyle="-" if layer == L - 1 else ":",
                    label=f"L{layer}H{head}",
                )
        _mark_phase(ax, step)
        ax.set(xlabel="step", ylabel="attention mass", title=title, ylim=(0, 1))
    ind_ax.legend(fontsize=7, ncol=L)
    labels = [f"L{a.layer}H{a.head}" for a in run.ablation]
    x = torch.arange(len(labels)).numpy()
    abl_ax.bar(x - 0.2, [a.zero for a in run.ablation], width=0.4, label="zero-ablated")
    abl_ax.bar(x + 0.2, [a.mean for a in run.ablation], width=0.4, label="mean-ablated")
    abl_ax.axhline(run.final.loss_second, color="0.3", linestyle="--", label="no ablation")
    abl_ax.set_xticks(x, labels, fontsize=7)
    top = max(max(a.zero, a.mean) for a in run.ablation)
    abl_ax.set(ylabel="repeated-copy loss", title="repeated-copy loss without each head")
    abl_ax.set_ylim(0, 1.3 * top)  # room for the legend above the bars
    abl_ax.legend(fontsize=8, loc="upper center", ncol=3)
    fig.suptitle(
        f"induction heads: {run.config.position} positions, seed {run.config.seed}", fontsize=11
    )
    save_figure(fig, path, dpi=110)


def reverse_png(run: ReverseRun, path: str | Path, *, example: int | None = None) -> None:
    """The best cross-attention head's weights on one held-out example (default: the first of
    the longest) beside the true alignment (the anti-diagonal), tokens on the axes."""
    from .reverse import cross_attention

    batch = run.held_out
    assert batch is not None
    if example is None:
        example = int(batch.lengths.argmax())  # argmax returns the first maximum
    alignment = run.final.alignment
    layer, head = divmod(int(alignment.argmax()), alignment.shape[1])
    n = int(batch.lengths[example])
    one = batch.rows(slice(example, example + 1))
    weights = cross_attention(run.model, one)[layer, 0, head, :n, :n]  # (n targets, n sources)
    truth = torch.zeros(n, n)
    truth[torch.arange(n), n - 1 - torch.arange(n)] = 1.0  # query t reads source n - 1 - t
    src = [str(int(t)) for t in batch.src[example, :n]]
    tgt = [str(int(t)) for t in batch.tgt_out[example, :n]]
    fig = _figure(9, 4.4)
    axes = fig.subplots(1, 2)
    for ax, matrix, title in (
        (
            axes[0],
            weights,
            f"L{layer}H{head} cross-attention ({float(alignment.max()):.2f} aligned)",
        ),
        (axes[1], truth, "true alignment (reversal)"),
    ):
        ax.imshow(matrix.numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set_xticks(range(n), src, fontsize=7)
        ax.set_yticks(range(n), tgt, fontsize=7)
        ax.set(xlabel="source token", ylabel="target token (decoder query)", title=title)
    fig.suptitle(f"sequence reversal: held-out example {example}, {n} tokens", fontsize=11)
    save_figure(fig, path, dpi=110)
