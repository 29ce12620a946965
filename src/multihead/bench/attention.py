"""`multihead bench attention`: MultiHeadAttention vs torch.nn.MultiheadAttention and the floor.

The floor is the least work any MHA can do: one fused QKV linear, torch SDPA, one output linear,
written inline with the best memory layout we found. Shapes are (B, T, E, H).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import compat
from ..functional import explain
from ..modules import MultiHeadAttention
from ..table import format_table
from . import attention_small
from .timing import (
    dtype_name,
    environment,
    matmul_gflops,
    measure,
    resolve_device,
    resolve_dtype,
)

DEFAULT_SHAPES = [(8, 512, 512, 8), (1, 4096, 512, 8), (64, 32, 384, 12), (1, 16, 256, 4)]
QUICK_SHAPES = [(2, 64, 128, 4), (1, 16, 256, 4)]


@dataclass
class Row:
    shape: tuple[int, int, int, int]
    mode: str
    seconds: dict[str, float]
    gflops: float  # of multihead's MHA

    def ratio(self, name: str, peer: str) -> float:
        return self.seconds[name] / self.seconds[peer]


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
    B: int,
    T: int,
    E: int,
    H: int,
    train: bool,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> dict[str, Callable[[], object]]:
    """Every contender on identical weights and input (on `device`, in `dtype`); torch and the
    drop-in get `need_weights=False`, as TransformerEncoderLayer passes."""
    torch.manual_seed(0)
    ours = MultiHeadAttention(E, H)
    theirs = nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.in_proj.weight)
        theirs.in_proj_bias.copy_(ours.in_proj.bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    drop_in = compat.from_torch(theirs)
    theirs_seq = copy.deepcopy(theirs)  # torch's default layout: (T, B, E)
    theirs_seq.batch_first = False
    drop_in_seq = compat.from_torch(theirs_seq)
    floor = Floor(ours)
    for m in (ours, theirs, drop_in, theirs_seq, drop_in_seq, floor):
        m.train(train)
        m.to(device=device, dtype=dtype)
    x = torch.randn(B, T, E, device=device, dtype=dtype)
    x_seq = x.transpose(0, 1).contiguous()

    def run(module_call: Callable[[], torch.Tensor]) -> Callable[[], object]:
        if train:
            return lambda: module_call().sum().backward()

        def infer():
            with torch.no_grad():
                return module_call()

        return infer

    return {
        "mh": run(lambda: ours(x)),
        "floor": run(lambda: floor(x)),
        "torch": run(lambda: theirs(x, x, x, need_weights=False)[0]),
        "drop-in": run(lambda: drop_in(x, x, x, need_weights=False)[0]),
        "torch TBE": run(lambda: theirs_seq(x_seq, x_seq, x_seq, need_weights=False)[0]),
        "drop-in TBE": run(lambda: drop_in_seq(x_seq, x_seq, x_seq, need_weights=False)[0]),
    }


# (contender, peer) pairs whose time ratio the table shows.
RATIOS = [
    ("mh", "floor"),
    ("mh", "torch"),
    ("drop-in", "torch"),
    ("drop-in TBE", "torch TBE"),
]


def run_suite(
    shapes: list[tuple[int, int, int, int]],
    *,
    repeats: int = 7,
    modes: tuple[str, ...] = ("eval", "train"),
    progress: Callable[[str], None] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> list[Row]:
    rows = []
    for shape in shapes:
        for mode in modes:
            if progress:
                progress(f"{mode} B,T,E,H={shape}")
            fns = contenders(*shape, train=mode == "train", device=device, dtype=dtype)
            seconds = measure(fns, repeats=repeats, device=device)
            B, T, E, _ = shape
            flops = mha_flops(B, T, E) * (3 if mode == "train" else 1)
            rows.append(Row(shape, mode, seconds, flops / seconds["mh"] / 1e9))
    return rows


def report(
    rows: list[Row],
    matmul: float,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> str:
    names = list(rows[0].seconds)
    headers = ["B,T,E,H", "mode", *(f"{n} ms" for n in names)]
    headers += [f"{a}/{b}" for a, b in RATIOS] + ["GFLOP/s"]
    body = []
    for r in rows:
        cells = [",".join(map(str, r.shape)), r.mode]
        cells += [f"{r.seconds[n] * 1e3:.3f}" for n in names]
        cells += [f"{r.ratio(a, b):.2f}x" for a, b in RATIOS]
        cells.append(f"{r.gflops:.1f}")
        body.append(cells)
    env = environment(device)
    B, T, E, H = rows[0].shape
    x = torch.randn(B, H, T, E // H, device=device, dtype=dtype)
    name = dtype_name(dtype)
    lines = [
        f"multihead bench attention: medians of interleaved runs, {name}; "
        + ", ".join(f"{k} {v}" for k, v in env.items()),
        f"backend chosen by multihead: {explain(x, x, x).chosen}; "
        f"machine matmul: {matmul:.1f} GFLOP/s (1024^3 {name}); GFLOP/s column: mh",
        "mh = multihead.MultiHeadAttention; floor = fused linear + SDPA + linear inline;",
        "torch = torch.nn.MultiheadAttention(batch_first=True); drop-in = multihead.compat's;",
        "TBE = both in torch's default (T, B, E) layout; torch and drop-in get need_weights=False.",
        "a/b = time of a / time of b (below 1.00x: a is faster).",
        "",
        format_table(headers, body),
    ]
    return "\n".join(lines)


def main(
    quick: bool = False,
    repeats: int | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "fp32",
) -> str:
    """The table. `device`: "cpu" or "cuda" (timed with CUDA events); `dtype`: "fp32",
    "bf16" or "fp16" (weights and inputs)."""
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    shapes = QUICK_SHAPES if quick else DEFAULT_SHAPES
    reps = repeats or (3 if quick else 7)
    rows = run_suite(
        shapes,
        repeats=reps,
        progress=lambda s: print(f"  measuring {s}", file=sys.stderr, flush=True),
        device=dev,
        dtype=dt,
    )
    text = report(rows, matmul_gflops(device=dev, dtype=dt), device=dev, dtype=dt)
    if dev.type == "cpu" and dt == torch.float32:  # per-call overhead: the small-call rows
        rounds = reps if quick else max(reps, attention_small.ROUNDS)
        text += "\n\n" + attention_small.report(repeats=rounds)
    return text
