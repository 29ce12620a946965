"""Converted torch encoders vs torch's own fused eval path.

    multihead bench encoder-layer [--quick] [--repeats N]

`replace_attention` switches torch's TransformerEncoderLayer to the standard path (so that the
drop-in runs) and turns off TransformerEncoder's nested tensors. This times, in eval under no_grad
on identical weights, torch's layer (its fused `_transformer_encoder_layer_fwd`) against the
converted layer, and a 2-layer torch encoder (nested tensors on, as by default) against the
converted encoder, with and without a key padding mask (item lengths drawn between T/2 and T,
one item full). Contenders run interleaved in one process; medians and ratios are reported.

Shapes are (B, T, E, H); the feed-forward width is 4E.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from ..compat import replace_attention
from ..table import format_table
from .timing import environment, measure

DEFAULT_SHAPES = [(8, 128, 256, 4), (32, 64, 512, 8), (1, 512, 768, 12)]
QUICK_SHAPES = [(2, 32, 64, 4)]


def _models(E: int, H: int) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 4 * E, dropout=0.0, batch_first=True).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note about nested tensors
        encoder = nn.TransformerEncoder(copy.deepcopy(layer), 2, enable_nested_tensor=True)
    encoder.eval()
    return {
        "torch layer": layer,
        "converted layer": replace_attention(copy.deepcopy(layer)),
        "torch encoder": encoder,
        "converted encoder": replace_attention(copy.deepcopy(encoder)),
    }


def _padding(B: int, T: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    return torch.arange(T)[None, :] >= lengths[:, None]  # (B, T), True = padding


def run(shapes: list[tuple[int, int, int, int]], repeats: int) -> list[list[str]]:
    rows = []
    for B, T, E, H in shapes:
        models = _models(E, H)
        x = torch.randn(B, T, E)
        for label, kwargs in (("none", {}), ("padded", {"src_key_padding_mask": _padding(B, T)})):
            calls: dict[str, Callable[[], object]] = {
                name: partial(m, x, **kwargs) for name, m in models.items()
            }
            with torch.no_grad():
                seconds = measure(calls, repeats=repeats)
            ms = {k: v * 1e3 for k, v in seconds.items()}
            rows.append(
                [
                    f"{B},{T},{E},{H}",
                    label,
                    f"{ms['torch layer']:.2f}",
                    f"{ms['converted layer']:.2f}",
                    f"{ms['converted layer'] / ms['torch layer']:.2f}x",
                    f"{ms['torch encoder']:.2f}",
                    f"{ms['converted encoder']:.2f}",
                    f"{ms['converted encoder'] / ms['torch encoder']:.2f}x",
                ]
            )
    return rows


def report(*, quick: bool = False, repeats: int = 9) -> str:
    """The table: every default shape (one small shape with `quick`), `repeats` rounds."""
    shapes = QUICK_SHAPES if quick else DEFAULT_SHAPES
    rows = run(shapes, 3 if quick else repeats)
    env = ", ".join(f"{k} {v}" for k, v in environment().items())
    header = [
        "B,T,E,H",
        "padding",
        "torch layer ms",
        "converted ms",
        "ratio",
        "torch encoder ms",
        "converted ms",
        "ratio",
    ]
    return "\n".join(
        [
            f"converted encoders vs torch's fused eval path (no_grad), medians, fp32; {env}",
            "layer: TransformerEncoderLayer; encoder: 2 layers, torch's with nested tensors on.",
            "ratio = converted / torch (below 1.00x: the converted model is faster).\n",
            format_table(header, rows),
        ]
    )
