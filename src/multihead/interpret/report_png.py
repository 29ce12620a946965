"""PNG reports with matplotlib: the layers x heads grid, one head's heatmap, metric heatmaps.

Weights are drawn on a square-root colour scale (small weights stay visible), with a colour bar
in weight units. Figure sizes do not grow with the text: long texts get thinned token labels
and max-pooled thumbnails (a one-token-wide diagonal keeps its contrast). `path` may be a file
name or a binary file object; the format is always PNG, whatever the name ends in. In a causal
analysis the upper triangle (keys after the query, which a causal head cannot see) is grey, and
metrics a causal pattern does not define are drawn as "n/a"."""

from __future__ import annotations

import math
import textwrap

import numpy as np

from ..atomic import save_figure
from .analysis import Analysis

THUMB = 64  # thumbnail pixels per side, at most
MAX_HEAD_INCHES = 11.0  # the single-head heatmap's axes, at most (about 1,500 px at 120 dpi)
SHORT = {
    "previous-token": "prev",
    "next-token": "next",
    "special-token sink": "sink",
    "punctuation": "punct",
    "duplicate-token": "dup",
    "induction": "ind",
    "positional": "pos",
}


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("PNG reports need matplotlib: pip install 'multihead[report]'") from None
    return plt


FUTURE = "#dedede"  # cells above a causal diagonal: not attended, not weight 0
FUTURE_NOTE = "grey: later keys, which a causal head cannot attend to"


def _norm():
    from matplotlib.colors import PowerNorm

    return PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)


def _cmap(plt):
    return plt.get_cmap("Blues").with_extremes(bad=FUTURE)


def _hide_future(a: np.ndarray, causal: bool, pool: int | None = None) -> np.ndarray:
    """(T, T) weights, max-pooled to `pool` cells per side if given; with `causal`, the cells
    that cover only keys after their queries masked (drawn in the colour map's "bad" grey)."""
    shown = a if pool is None else max_pool(a, pool)
    if not causal:
        return shown
    T = a.shape[-1]
    visible = np.tril(np.ones((T, T), dtype=np.float32))  # key <= query
    if pool is not None:
        visible = max_pool(visible, pool)
    return np.ma.masked_where(visible == 0, shown)


def _title(text: str, width: int, lines: int = 2) -> str:
    wrapped = textwrap.wrap(text, width) or [""]
    if len(wrapped) > lines:
        wrapped = [*wrapped[: lines - 1], wrapped[lines - 1][: width - 1] + "…"]
    return "\n".join(wrapped)


def max_pool(a: np.ndarray, size: int) -> np.ndarray:
    """(T, T) -> (S, S), S = min(T, size): each cell the largest weight of the block it covers."""
    T = a.shape[-1]
    if T <= size:
        return a
    edges = np.linspace(0, T, size + 1).astype(int)
    rows = np.maximum.reduceat(a, edges[:-1], axis=0)  # (S, T)
    return np.maximum.reduceat(rows, edges[:-1], axis=1)  # (S, S)


def _label(analysis: Analysis, layer: int, head: int) -> str:
    roles = analysis.roles[layer][head]
    text_roles = [r for r in roles if r.source == "text"]
    if not roles:
        return f"L{layer} H{head}"
    r = (text_roles or roles)[0]
    star = "*" if r.source == "probe" else ""
    return f"L{layer} H{head}\n{SHORT.get(r.role, r.role)}{star} {r.value:.2f}"


def grid_png(analysis: Analysis, path, *, text_index: int = 0, title: str = "") -> None:
    """Every head's attention as a thumbnail, labelled with its strongest measured role."""
    plt = _pyplot()
    L, H = analysis.shape
    attn = analysis.texts[text_index].attn.numpy()
    fig, axes = plt.subplots(
        L, H, figsize=(1.1 * H + 1.2, 1.3 * L + 1.0), squeeze=False, layout="constrained"
    )
    norm = _norm()
    cmap = _cmap(plt)
    image = None
    for layer in range(L):
        for head in range(H):
            ax = axes[layer][head]
            thumb = _hide_future(attn[layer, head], analysis.causal, THUMB)
            image = ax.imshow(thumb, cmap=cmap, norm=norm, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(_label(analysis, layer, head), fontsize=6, pad=2)
    heading = title or "attention by layer (rows) and head (columns)"
    notes = " ".join(analysis.notes)
    footer = "* measured on repeated random tokens; thumbnails show each block's largest weight"
    if analysis.causal:
        footer += f"; {FUTURE_NOTE}"
    fig.suptitle(_title(heading, 110), fontsize=9)
    fig.supxlabel("\n".join([_title(notes, 150), footer] if notes else [footer]), fontsize=6)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight (√ scale)")
    save_figure(fig, path, dpi=110, format="png")
    plt.close(fig)


def head_png(analysis: Analysis, layer: int, head: int, path, *, text_index: int = 0) -> None:
    """One head's heatmap with token labels (thinned when long) and a colour bar."""
    plt = _pyplot()
    item = analysis.texts[text_index]
    a = item.attn[layer, head].numpy()
    T = len(item.tokens)
    side = min(MAX_HEAD_INCHES, max(3.0, 0.2 * T))
    stride = max(1, math.ceil(T / (side * 72 / 8)))  # 7-pt labels need about 8 pt each
    fig, ax = plt.subplots(figsize=(side + 2.4, side + 1.8), layout="constrained")
    im = ax.imshow(
        _hide_future(a, analysis.causal), cmap=_cmap(plt), norm=_norm(), interpolation="nearest"
    )
    ticks = list(range(0, T, stride))
    labels = [item.tokens[i] for i in ticks]
    ax.set_xticks(ticks, labels, rotation=90, fontsize=7)
    ax.set_yticks(ticks, labels, fontsize=7)
    thinned = f" (1 token in {stride} labelled)" if stride > 1 else ""
    ax.set_xlabel("key" + thinned)
    ax.set_ylabel("query")
    roles = analysis.roles[layer][head]
    summary = "; ".join(str(r) for r in roles) if roles else "no clear role"
    ax.set_title(_title(f"layer {layer}, head {head}: {summary}", int(12 * side)), fontsize=8)
    notes = [*analysis.notes, *([FUTURE_NOTE] if analysis.causal else [])]
    if notes:
        fig.supxlabel(_title("; ".join(notes), int(14 * side), 3), fontsize=7)
    fig.colorbar(im, ax=ax, fraction=0.046, label="attention weight (√ scale)")
    save_figure(fig, path, dpi=120, format="png")
    plt.close(fig)


def metrics_png(
    analysis: Analysis,
    path,
    metrics=("previous", "next", "special", "entropy_norm", "duplicate", "induction"),
) -> None:
    """Metric heatmaps, [layers x heads] each ("n/a" for a metric the analysis leaves
    undefined, as next-token mass in a causal LM)."""
    plt = _pyplot()
    names = [m for m in metrics if m in analysis.metrics or m in analysis.undefined]
    fig, axes = plt.subplots(
        1, len(names), figsize=(3.2 * len(names), 3), squeeze=False, layout="constrained"
    )
    for ax, name in zip(axes[0], names, strict=True):
        if name not in analysis.metrics:
            ax.set_title(name, fontsize=9)
            ax.text(0.5, 0.5, "n/a", ha="center", va="center", fontsize=14, color="#666")
            ax.text(
                0.5,
                0.3,
                textwrap.fill(analysis.undefined[name], 28),
                ha="center",
                va="top",
                fontsize=7,
                color="#666",
            )
            ax.set_axis_off()
            continue
        values = analysis.metrics[name].numpy()
        im = ax.imshow(values, cmap="viridis", vmin=0, vmax=1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax, fraction=0.046)
    save_figure(fig, path, dpi=110, format="png")
    plt.close(fig)
