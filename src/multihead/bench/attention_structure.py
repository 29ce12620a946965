"""`multihead bench attention --mask window|documents|prefix`: structured attention against its
ideal, the cost of the pairs it allows.

The ideal of a structured call is (allowed pairs / causal pairs) x the time of plain causal
attention by the same function, measured side by side; for the module it is projection-aware
(the projections' time, plus that fraction of the causal attention's). Peers in the same run:
SDPA under the dense (T, T) mask, and compiled `flex_attention` with a BlockMask (forward
only: torch has no flex backward on CPU). Forward + backward unless marked. Every contender
runs once per round, in a fresh random order; a row's ratio is the median over rounds of the
structured time over the ideal from the same round's samples.

Shapes: the function at q/k/v (1, 8, T, 64); the module at width 512, 8 heads, (1, T, 512).
`mask_mod` is the causal window given as a mask function (tiles of 128), held as a plan built
once outside the timed rounds (`functional.block_mask`, as flex's BlockMask is; its build time
is a column, beside create_block_mask's, and the bare function classified on every call is one
more contender of the function rows). Every case but `prefix` gives each query row one interval of
keys, so in float32 on the CPU each runs the interval kernel (`backends.tile_intervals`: a C
kernel that computes exactly the allowed pairs): `window=` and `documents=` directly, a held
plan that is exactly a causal window or causal documents (`documents_mod`) as those do, and
`general_mod` (the documents with a window of 64 inside them as a mask function: neither) from
the rows of its causal band (`functional.mask_band`), found once per plan. Where the kernel
does not run (other dtypes, devices, no C compiler) the band, the documents' runs and the
masked band (`backends.tile_masked_band`) do, as before.

Targets (issue 41): the function within 2x of its ideal (3x beside a busy process), the module
within 1.2x of its projection-aware ideal.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F

from ..functional import attention, block_mask, masks
from ..functional.backends.tile_threads import recorded_choices
from ..modules import MultiHeadAttention
from ..table import format_table
from .timing import MAX_ROUNDS_FACTOR, environment, measure_rounds, median_ratio

MASKS = ("window", "documents", "prefix", "mask_mod", "documents_mod", "general_mod")
# given as mask functions, held as plans
MOD_KINDS = ("mask_mod", "documents_mod", "general_mod")
WINDOW, DOCUMENTS = 256, 8
FUNCTION_T, MODULE_T = (4096, 8192), (1024, 4096)
QUICK_FUNCTION_T, QUICK_MODULE_T = (1024,), (1024,)
FUNCTION_TARGET, FUNCTION_TARGET_CONTENDED, MODULE_TARGET = 2.0, 3.0, 1.2
MOD_BLOCK = 128  # the mask_mod case's tiles
# Seconds of rounds a row may take: a cheaper row runs more than --repeats rounds (at most 4x;
# `timing.measure_rounds`), so a short call's median beside a busy process stands on more
# rounds
ROUND_BUDGET = 12.0
GENERAL_WINDOW = 64  # general_mod's window inside the documents (shorter than every one)


def _window_mod(b, h, q_idx, kv_idx):
    """The causal window of WINDOW as a mask function (the `mask_mod` case)."""
    return (kv_idx <= q_idx) & (q_idx - kv_idx < WINDOW)


def _documents_mod(T: int) -> Callable:
    """The documents case (DOCUMENTS equal causal documents) as a mask function."""
    ids = torch.arange(DOCUMENTS).repeat_interleave(T // DOCUMENTS)  # (T,)

    def documents(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (ids[q_idx] == ids[kv_idx])

    return documents


def _general_mod(T: int) -> Callable:
    """The documents with a causal window of GENERAL_WINDOW inside them, as a mask function:
    neither a window alone nor documents alone (its rows are key intervals: the interval kernel)."""
    ids = torch.arange(DOCUMENTS).repeat_interleave(T // DOCUMENTS)  # (T,)

    def windowed_documents(b, h, q_idx, kv_idx):
        same = ids[q_idx] == ids[kv_idx]
        return (kv_idx <= q_idx) & (q_idx - kv_idx < GENERAL_WINDOW) & same

    return windowed_documents


def structure_args(kind: str, T: int, B: int = 1) -> dict:
    """The `attention()` arguments of one benchmark case (all causal)."""
    if kind == "window":
        return {"window": WINDOW}
    if kind == "mask_mod":
        return {"mask_mod": _window_mod, "block_size": MOD_BLOCK}
    if kind == "documents_mod":
        return {"mask_mod": _documents_mod(T), "block_size": MOD_BLOCK}
    if kind == "general_mod":
        return {"mask_mod": _general_mod(T), "block_size": MOD_BLOCK}
    if kind == "documents":
        ids = torch.arange(DOCUMENTS).repeat_interleave(T // DOCUMENTS)  # (T,)
        return {"documents": ids[None].expand(B, T)}
    if kind == "prefix":
        return {"prefix": T // 4}
    raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {kind!r}")


def allowed_pairs(kind: str, T: int) -> int:
    """Query-key pairs a causal call of this kind allows (counted per row)."""
    if kind in ("window", "mask_mod"):
        return sum(min(i + 1, WINDOW) for i in range(T))
    if kind in ("documents", "documents_mod"):
        n = T // DOCUMENTS
        return DOCUMENTS * n * (n + 1) // 2
    if kind == "general_mod":
        return DOCUMENTS * sum(min(i + 1, GENERAL_WINDOW) for i in range(T // DOCUMENTS))
    P = T // 4
    return P * P + sum(i + 1 for i in range(P, T))


def dense_mask(kind: str, T: int) -> torch.Tensor:
    """The (1 or B, 1, T, T) boolean mask the structure replaces (causal included)."""
    if kind in ("window", "mask_mod"):
        return masks.sliding_window(T, T, WINDOW)
    if kind in ("documents", "documents_mod"):
        ids = structure_args("documents", T)["documents"]
        return (ids[:, :, None] == ids[:, None, :])[:, None] & masks.causal(T)
    if kind == "general_mod":
        return dense_mask("documents", T) & masks.sliding_window(T, T, GENERAL_WINDOW)
    P = T // 4
    mask = masks.causal(T)
    mask[:P, :P] = True
    return mask


def _train(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    return lambda: fn().sum().backward()


def _recording(fn: Callable[[], None], seen: list[int]) -> Callable[[], None]:
    """fn, adding the per-call thread choices of its fast-path calls to seen."""

    def run() -> None:
        with recorded_choices() as now:
            fn()
        seen.extend(now)

    return run


def inline_cell(seen: list[int]) -> str:
    """The "inline" cell: how many of a contender's fast-path calls (forward and backward, every
    round and the warm-up) ran inline (`tile_threads.per_call` chose 1), of how many; empty
    where none ran (the general tile plan)."""
    if not seen:
        return ""
    return f"{sum(1 for n in seen if n <= 1)}/{len(seen)}"


BUILDS = 3  # plan builds timed per row (median)
T_ = TypeVar("T_")


def _timed(build: Callable[[], T_]) -> tuple[T_, float]:
    """build()'s result and the median of BUILDS timings of it."""
    times = []
    for _ in range(BUILDS):
        start = time.perf_counter()
        made = build()
        times.append(time.perf_counter() - start)
    return made, statistics.median(times)


def held(kind: str, T: int, args: dict) -> tuple[dict, str]:
    """The `mask_mod` case's arguments with the function held as a plan (block_mask, built
    here, outside the timed rounds) and the build's milliseconds; other kinds as given."""
    if kind not in MOD_KINDS:
        return args, ""
    plan, seconds = _timed(
        lambda: block_mask(args["mask_mod"], None, None, T, T, block_size=args["block_size"])
    )
    return {"mask_mod": plan}, f"{seconds * 1e3:.0f}"


def _flex(kind: str, q, k, v) -> tuple[Callable[[], object], float] | str:
    """Compiled flex_attention with a BlockMask (forward) and the BlockMask's build seconds,
    or why it cannot run here."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:  # pragma: no cover - old torch
        return f"n/a ({e})"
    T = q.shape[2]
    ids = structure_args("documents", T)["documents"][0]
    P = T // 4

    def mask_mod(b, h, i, j):
        if kind in ("window", "mask_mod"):
            return (j <= i) & (i - j < WINDOW)
        if kind in ("documents", "documents_mod"):
            return (j <= i) & (ids[i] == ids[j])
        if kind == "general_mod":
            return (j <= i) & (i - j < GENERAL_WINDOW) & (ids[i] == ids[j])
        return (j <= i) | ((i < P) & (j < P))

    try:
        block, build = _timed(
            lambda: create_block_mask(mask_mod, None, None, T, T, device=str(q.device))
        )
        # Every row compiles flex_attention's one code object anew (its own shapes and mask):
        # past dynamo's recompile limit (8) a later row would silently time flex's unfused
        # eager fallback, so each row starts from an empty compile cache (rows share nothing).
        torch._dynamo.reset()
        compiled = torch.compile(flex_attention, dynamic=False)
        qd, kd, vd = q.detach(), k.detach(), v.detach()

        def run():
            with torch.no_grad():
                return compiled(qd, kd, vd, block_mask=block)

        run()  # compile now, not inside the timed rounds
        return run, build
    except Exception as e:  # torch.compile needs a C++ toolchain; report, do not fail
        return f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:60]})"


def function_row(kind: str, T: int, repeats: int) -> list[str]:
    """attention() at q/k/v (1, 8, T, 64): causal, structured, dense-mask SDPA, flex."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 8, T, 64, requires_grad=True) for _ in range(3))
    bare = structure_args(kind, T)
    args, build_cell = held(kind, T, bare)
    dense = dense_mask(kind, T)
    seen: list[int] = []  # the structured contender's per-call thread choices
    fns = {
        "causal": _train(lambda: attention(q, k, v, causal=True)),
        "structured": _recording(_train(lambda: attention(q, k, v, causal=True, **args)), seen),
        "dense sdpa": _train(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)),
        "structured fwd": lambda: _no_grad(lambda: attention(q, k, v, causal=True, **args)),
    }
    if kind in MOD_KINDS:  # the bare function, classified on every call
        fns["per call"] = _train(lambda: attention(q, k, v, causal=True, **bare))
    flex = _flex(kind, q, k, v)
    if not isinstance(flex, str):
        fns["flex fwd"] = flex[0]
    rounds = measure_rounds(fns, repeats=repeats, warmup=1, min_time=0.0, budget=ROUND_BUDGET)
    share = allowed_pairs(kind, T) / (T * (T + 1) / 2)
    ideals = [share * c for c in rounds["causal"]]
    s, ratio = _medians(rounds), median_ratio(rounds["structured"], ideals)
    ideal = statistics.median(ideals)
    flex_cell = f"{s['flex fwd'] * 1e3:.0f}" if "flex fwd" in s else str(flex)
    flex_build = "" if isinstance(flex, str) else f"{flex[1] * 1e3:.0f}"
    per_call = f"{s['per call'] * 1e3:.0f}" if "per call" in s else ""
    return [
        kind, f"attention() T={T}", f"{s['causal'] * 1e3:.0f}", f"{ideal * 1e3:.0f}",
        f"{s['structured'] * 1e3:.0f}", f"{ratio:.2f}x", str(len(rounds["structured"])),
        f"{s['dense sdpa'] * 1e3:.0f}", f"{s['structured fwd'] * 1e3:.0f}", flex_cell,
        build_cell, flex_build, per_call, inline_cell(seen), "",
    ]  # fmt: skip


def _medians(rounds: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(times) for name, times in rounds.items()}


def _no_grad(fn):
    with torch.no_grad():
        return fn()


def module_row(kind: str, T: int, repeats: int) -> list[str]:
    """MultiHeadAttention(512, 8, causal=True) on (1, T, 512): causal, structured, dense mask,
    its projections alone (for the projection-aware ideal), and the same structured
    attention() alone at (1, 8, T, 64) (for the "around ms" cell: what the module adds
    around its projections and the function, per round)."""
    torch.manual_seed(0)
    m = MultiHeadAttention(512, 8, causal=True)
    x = torch.randn(1, T, 512, requires_grad=True)
    args, build_cell = held(kind, T, structure_args(kind, T))
    dense = dense_mask(kind, T)

    def projections():  # the module's linear work alone: in_proj, out_proj
        qkv = F.linear(x, m.in_proj.weight, m.in_proj.bias)
        return F.linear(qkv[..., :512], m.out_proj.weight, m.out_proj.bias)

    # the function's own inputs (as its row's): the call the module makes, without the module
    q, k, v = (torch.randn(1, 8, T, 64, requires_grad=True) for _ in range(3))
    seen: list[int] = []  # the structured contender's per-call thread choices
    fns: dict[str, Callable[[], object]] = {
        "causal": _train(lambda: m(x)),
        "structured": _recording(_train(lambda: m(x, **args)), seen),
        "dense mask": _train(lambda: m(x, mask=dense)),  # the path structure replaces
        "projections": _train(projections),
        "attention": _train(lambda: attention(q, k, v, causal=True, **args)),
    }
    rounds = measure_rounds(fns, repeats=repeats, warmup=1, min_time=0.0, budget=ROUND_BUDGET)
    share = allowed_pairs(kind, T) / (T * (T + 1) / 2)
    ideals = [
        p + share * max(c - p, 0.0)
        for p, c in zip(rounds["projections"], rounds["causal"], strict=True)
    ]
    s, ratio = _medians(rounds), median_ratio(rounds["structured"], ideals)
    ideal = statistics.median(ideals)
    return [
        kind, f"module T={T}", f"{s['causal'] * 1e3:.0f}", f"{ideal * 1e3:.0f}",
        f"{s['structured'] * 1e3:.0f}", f"{ratio:.2f}x", str(len(rounds["structured"])),
        f"{s['dense mask'] * 1e3:.0f}", "", "", build_cell, "", "", inline_cell(seen),
        around_cell(rounds),
    ]  # fmt: skip


def around_cell(rounds: dict[str, list[float]]) -> str:
    """The "around ms" cell of a module row: the median over rounds of structured -
    projections - attention() alone, the milliseconds the module spends around its
    projections and the structured function (layout, thread hand-offs after a GEMM, the
    caches the GEMMs leave); empty where the function was not measured."""
    if "attention" not in rounds:
        return ""
    around = [
        s - p - a
        for s, p, a in zip(
            rounds["structured"], rounds["projections"], rounds["attention"], strict=True
        )
    ]
    return f"{statistics.median(around) * 1e3:.0f}"


def holds(ratio_cell: str, target: float) -> str:
    """The "holds" cell of a row: whether its ratio (a cell such as "1.23x") is within target."""
    return "yes" if float(ratio_cell.rstrip("x")) <= target else "NO"


HEADERS = ["mask", "call", "causal ms", "ideal ms", "structured ms", "/ideal", "rounds",
           "dense-mask ms", "structured fwd ms", "flex fwd ms", "plan build ms",
           "flex build ms", "per-call mod ms", "inline", "around ms", "target",
           "holds"]  # fmt: skip


def rows(
    kinds: tuple[str, ...], *, quick: bool = False, repeats: int = 3, contended: bool = False
) -> list[list[str]]:
    """The table's rows (cells as HEADERS) for the masks in `kinds`."""
    progress = lambda s: print(f"  measuring {s}", file=sys.stderr, flush=True)  # noqa: E731
    function_target = FUNCTION_TARGET_CONTENDED if contended else FUNCTION_TARGET
    body = []
    for kind in kinds:
        for T in QUICK_FUNCTION_T if quick else FUNCTION_T:
            progress(f"attention() {kind} T={T}")
            row = function_row(kind, T, repeats)
            body.append([*row, f"{function_target:.2f}x", holds(row[5], function_target)])
        for T in QUICK_MODULE_T if quick else MODULE_T:
            progress(f"module {kind} T={T}")
            row = module_row(kind, T, repeats)
            body.append([*row, f"{MODULE_TARGET:.2f}x", holds(row[5], MODULE_TARGET)])
    return body


def report(body: list[list[str]], *, contended: bool = False) -> str:
    """The table of `rows`, with its legend."""
    function_target = FUNCTION_TARGET_CONTENDED if contended else FUNCTION_TARGET
    env = environment("cpu")
    lines = [
        "multihead bench attention --mask: medians of interleaved runs, fp32, forward + "
        "backward unless 'fwd'; " + ", ".join(f"{k} {v}" for k, v in env.items()),
        f"window = {WINDOW}; documents = {DOCUMENTS} equal causal documents; prefix = T/4; "
        f"mask_mod = the window as a mask function, tiles of {MOD_BLOCK}, held as a plan "
        "(block_mask, built outside the rounds: plan build ms; flex build ms: its "
        "create_block_mask; per-call mod ms: the bare function, classified every call); "
        "documents_mod = the documents as a mask function, held the same way (recognised "
        "as documents: the documents fast path on the ids it recovers); general_mod = the "
        f"documents with a window of {GENERAL_WINDOW} inside them as a mask function, held the "
        "same way; every case but prefix runs the interval kernel (one C call over each "
        "row's interval of keys: exactly the allowed pairs).",
        "ideal = allowed pairs / causal pairs x causal time of the same call (module: "
        "projections + that share of the causal attention), per round; /ideal = the median "
        "over rounds of structured / ideal; rounds = how many (--repeats, or more for a "
        f"cheap row: as many as {ROUND_BUDGET:g} s holds, at most "
        f"{MAX_ROUNDS_FACTOR}x); dense-mask = SDPA under the "
        "(T, T) mask (function: torch's; module: mask=); flex = compiled flex_attention "
        "with a BlockMask; inline = the structured call's fast-path calls (forward and "
        "backward) that ran inline on torch's own threads, of all (the per-call thread "
        "choice; the rest ran on the workers); around = the module's structured time less "
        "its projections and the same attention() alone at (1, 8, T, 64), per round (what "
        "the module adds around them); target: issue 41's (function "
        f"{function_target:g}x{' beside a busy process' if contended else ''}, module "
        f"{MODULE_TARGET:g}x).",
        "",
        format_table(HEADERS, body),
    ]
    return "\n".join(lines)


def main(
    kinds: tuple[str, ...], *, quick: bool = False, repeats: int = 3, contended: bool = False
) -> str:
    """The table for the masks in `kinds` (CPU, fp32); `contended`: measured beside a busy
    process (the function's target is then 3x, not 2x)."""
    body = rows(kinds, quick=quick, repeats=repeats, contended=contended)
    return report(body, contended=contended)
