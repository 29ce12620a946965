"""Small calls against the hand-written floor, for `multihead bench attention`: one
MultiHeadAttention eval call at (B 1, T 16, width 256, 4 heads), and one decode step with a KV
cache (width 576, 9 heads, 128 cached keys). The floor is F.linear + SDPA + F.linear written
inline; for decoding, the new key and value are written into a preallocated buffer.

Here per-call overhead is the cost, and it moves with the machine's load by more than the
gap being measured: a few long samples per contender (15 of 50 ms) read the same code at
1.11x-1.17x from run to run. So the rows take many short rounds (ROUNDS, each contender
~10 ms per round in a fresh random order) and report the median of the per-round ratios
mh / floor, each taken from two samples run next to each other: over three runs of one
commit they moved by 0.01 (eval) and 0.02 (decode).
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from ..modules import MultiHeadAttention
from ..modules.cache import KVCache
from ..table import format_table
from .timing import measure_rounds, median_ratio

CACHED = 128
ROUNDS = 201  # rounds of a full run (each ~20 ms per row); --quick runs its own few
SAMPLE_TIME = 0.01  # seconds per sample: short, so a round's two samples see the same load


def eval_contenders(B=1, T=16, E=256, H=4) -> dict:
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H).eval()
    x = torch.randn(B, T, E)
    w, b, wo, bo = m.in_proj.weight, m.in_proj.bias, m.out_proj.weight, m.out_proj.bias

    def floor():
        # (B, T, 3E) -> (3, B, H, T, D)
        q, k, v = F.linear(x, w, b).view(B, T, 3, H, E // H).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v)
        return F.linear(o.transpose(1, 2).reshape(B, T, E), wo, bo)

    def mh():
        return m(x)

    return {"mh": mh, "floor": floor}


def decode_contenders(E=576, H=9) -> dict:
    """One decode step after CACHED tokens; both sides rewind to CACHED before each step, so
    every call does the same work."""
    torch.manual_seed(0)
    D = E // H
    m = MultiHeadAttention(E, H, causal=True).eval()
    cache = KVCache(1, H, D, max_length=CACHED + 1)
    with torch.no_grad():
        m(torch.randn(1, CACHED, E), cache=cache)
    x = torch.randn(1, 1, E)
    w, b, wo, bo = m.in_proj.weight, m.in_proj.bias, m.out_proj.weight, m.out_proj.bias
    kbuf = torch.randn(1, H, CACHED + 1, D)
    vbuf = torch.randn(1, H, CACHED + 1, D)

    def floor():
        # (1, 1, 3E) -> (3, 1, H, 1, D)
        q, k, v = F.linear(x, w, b).view(1, 1, 3, H, D).permute(2, 0, 3, 1, 4)
        kbuf[:, :, CACHED : CACHED + 1] = k
        vbuf[:, :, CACHED : CACHED + 1] = v
        o = F.scaled_dot_product_attention(q, kbuf, vbuf)
        return F.linear(o.transpose(1, 2).reshape(1, 1, E), wo, bo)

    def mh():
        cache.length = cache._stored = CACHED  # rewind: the same step every call
        return m(x, cache=cache)

    return {"mh": mh, "floor": floor}


TARGET = 1.15  # mh / floor


def rows(repeats: int = ROUNDS) -> list[tuple[str, float, float, float]]:
    """(name, mh seconds, floor seconds, the median of the per-round ratios) of each row."""
    out = []
    with torch.no_grad():
        for name, fns in (
            ("eval B1 T16 E256 H4", eval_contenders()),
            (f"decode step E576 H9, {CACHED} cached", decode_contenders()),
        ):
            s = measure_rounds(fns, repeats=repeats, min_time=SAMPLE_TIME)
            ratio = median_ratio(s["mh"], s["floor"])
            mh, floor = (statistics.median(s[k]) for k in ("mh", "floor"))
            out.append((name, mh, floor, ratio))
    return out


def report(repeats: int = ROUNDS) -> str:
    """The two rows: medians of the times, and the median of the per-round ratios."""
    cells = [
        [name, f"{mh * 1e6:.0f}", f"{floor * 1e6:.0f}", f"{ratio:.2f}x"]
        for name, mh, floor, ratio in rows(repeats)
    ]
    table = format_table(["small call", "mh us", "floor us", "mh/floor"], cells)
    return (
        f"small calls (target mh/floor <= {TARGET}x; floor = F.linear + SDPA + F.linear inline; "
        f"mh/floor = median of {repeats} per-round ratios):\n" + table
    )
