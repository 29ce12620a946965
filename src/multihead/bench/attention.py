"""`multihead bench attention`: MultiHeadAttention vs torch.nn.MultiheadAttention and the floor.

The floor is the least work any MHA can do: one fused QKV linear, torch SDPA, one output linear,
written inline with the best memory layout we found. Shapes are (B, T, E, H).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..functional import explain
from ..modules import MultiHeadAttention
from .timing import environment, format_table, matmul_gflops, measure

DEFAULT_SHAPES = [(8, 512, 512, 8), (1, 4096, 512, 8), (64, 32, 384, 12), (1, 16, 256, 4)]
QUICK_SHAPES = [(2, 64, 128, 4), (1, 16, 256, 4)]


@dataclass
class Row:
    shape: tuple[int, int, int, int]
    mode: str
    seconds: dict[str, float]
    gflops: float  # of multihead's MHA

    def ratio(self, name: str, to: str = "multihead") -> float:
        return self.seconds[to] / self.seconds[name]


def mha_flops(B: int, T: int, E: int) -> float:
    """Forward FLOPs: QKV and output projections (8 B T E^2) plus QK^T and PV (4 B T^2 E)."""
    return 8 * B * T * E * E + 4 * B * T * T * E


class Floor(nn.Module):
    """One fused linear + torch SDPA + one linear: the layout-optimal minimum for MHA."""

    def __init__(self, mha: MultiHeadAttention):
        super().__init__()
        self.w, self.b = mha.in_proj.weight, mha.in_proj.bias
        self.wo, self.bo = mha.out_proj.weight, mha.out_proj.bias
        self.h = mha.num_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, E = x.shape
        # (B, T, 3E) -> (3, B, H, T, D)
        q, k, v = (
            F.linear(x, self.w, self.b).view(B, T, 3, self.h, E // self.h).permute(2, 0, 3, 1, 4)
        )
        o = F.scaled_dot_product_attention(q, k, v)
        return F.linear(o.transpose(1, 2).reshape(B, T, E), self.wo, self.bo)


def contenders(
    B: int, T: int, E: int, H: int, train: bool, extra: dict | None = None
) -> dict[str, Callable[[], object]]:
    torch.manual_seed(0)
    ours = MultiHeadAttention(E, H)
    theirs = nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():  # identical weights
        theirs.in_proj_weight.copy_(ours.in_proj.weight)
        theirs.in_proj_bias.copy_(ours.in_proj.bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    floor = Floor(ours)
    for m in (ours, theirs, floor):
        m.train(train)
    x = torch.randn(B, T, E)

    def run(module_call: Callable[[], torch.Tensor]) -> Callable[[], object]:
        if train:
            return lambda: module_call().sum().backward()

        def infer():
            with torch.no_grad():
                return module_call()

        return infer

    fns = {
        "multihead": run(lambda: ours(x)),
        "floor": run(lambda: floor(x)),
        "torch MHA": run(lambda: theirs(x, x, x, need_weights=False)[0]),
    }
    for name, make in (extra or {}).items():
        fns[name] = run(make(ours, x))
    return fns


def run_suite(
    shapes: list[tuple[int, int, int, int]],
    *,
    repeats: int = 7,
    modes: tuple[str, ...] = ("eval", "train"),
    extra: dict | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    rows = []
    for shape in shapes:
        for mode in modes:
            if progress:
                progress(f"{mode} B,T,E,H={shape}")
            fns = contenders(*shape, train=mode == "train", extra=extra)
            seconds = measure(fns, repeats=repeats)
            B, T, E, _ = shape
            flops = mha_flops(B, T, E) * (3 if mode == "train" else 1)
            rows.append(Row(shape, mode, seconds, flops / seconds["multihead"] / 1e9))
    return rows


def report(rows: list[Row], matmul: float) -> str:
    names = list(rows[0].seconds)
    peers = [n for n in names if n != "multihead"]
    headers = ["B, T, E, H", "mode", *(f"{n} ms" for n in names)]
    headers += [f"mh/{n}" for n in peers] + ["GFLOP/s"]
    body = []
    for r in rows:
        cells = [",".join(map(str, r.shape)), r.mode]
        cells += [f"{r.seconds[n] * 1e3:.3f}" for n in names]
        cells += [f"{r.ratio(n):.2f}x" for n in peers]
        cells.append(f"{r.gflops:.1f}")
        body.append(cells)
    env = environment()
    B, T, E, H = rows[0].shape
    x = torch.randn(B, H, T, E // H)
    lines = [
        "multihead bench attention — medians of interleaved runs, fp32, "
        + ", ".join(f"{k} {v}" for k, v in env.items()),
        f"backend chosen by multihead: {explain(x, x, x).chosen}; "
        f"machine matmul: {matmul:.1f} GFLOP/s (1024^3 fp32)",
        "mh/X = multihead time / X time (below 1.00x: multihead is faster)",
        "",
        format_table(headers, body),
    ]
    return "\n".join(lines)


def main(quick: bool = False, repeats: int | None = None, extra: dict | None = None) -> str:
    import sys

    shapes = QUICK_SHAPES if quick else DEFAULT_SHAPES
    reps = repeats or (3 if quick else 9)
    rows = run_suite(
        shapes,
        repeats=reps,
        extra=extra,
        progress=lambda s: print(f"  measuring {s}", file=sys.stderr),
    )
    return report(rows, matmul_gflops())
