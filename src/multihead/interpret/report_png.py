"""PNG reports with matplotlib: the layers x heads grid, one head's heatmap, metric heatmaps."""

from __future__ import annotations

import numpy as np

from .analysis import Analysis


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("PNG reports need matplotlib: pip install 'multihead[report]'") from None
    return plt


def grid_png(analysis: Analysis, path, *, text_index: int = 0, title: str = "") -> None:
    """Every head's attention as a thumbnail, labelled with its strongest measured role."""
    plt = _pyplot()
    L, H = analysis.shape
    attn = analysis.texts[text_index].attn.numpy()
    fig, axes = plt.subplots(L, H, figsize=(1.25 * H, 1.35 * L + 0.6), squeeze=False)
    for layer in range(L):
        for head in range(H):
            ax = axes[layer][head]
            ax.imshow(np.sqrt(attn[layer, head]), cmap="Blues", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            roles = analysis.roles[layer][head]
            label = f"L{layer}H{head}"
            if roles:
                label += f"\n{roles[0].role} {roles[0].value:.2f}"
            ax.set_title(label, fontsize=6)
    fig.suptitle(title or "attention by layer (rows) and head (columns)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def head_png(analysis: Analysis, layer: int, head: int, path, *, text_index: int = 0) -> None:
    """One head's heatmap with the token labels."""
    plt = _pyplot()
    item = analysis.texts[text_index]
    a = item.attn[layer, head].numpy()
    T = len(item.tokens)
    size = max(4.0, 0.28 * T + 1.5)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    im = ax.imshow(a, cmap="Blues", vmin=0, vmax=max(float(a.max()), 1e-6))
    ax.set_xticks(range(T), item.tokens, rotation=90, fontsize=7)
    ax.set_yticks(range(T), item.tokens, fontsize=7)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    roles = analysis.roles[layer][head]
    ax.set_title(
        f"layer {layer}, head {head}: " + (str(roles[0]) if roles else "no clear role"), fontsize=8
    )
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def metrics_png(
    analysis: Analysis,
    path,
    metrics=("previous", "next", "special", "entropy_norm", "duplicate", "induction"),
) -> None:
    """Metric heatmaps, [layers x heads] each."""
    plt = _pyplot()
    names = [m for m in metrics if m in analysis.metrics]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        values = analysis.metrics[name].numpy()
        im = ax.imshow(values, cmap="viridis", vmin=0, vmax=1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
