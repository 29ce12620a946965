"""`multihead bench patching`: every head at every position patched, one forward per patch (the
loop engine) vs the batched engine, and attribution patching beside them.

On a SmolLM2-135M-shaped Llama (random weights, or a checkpoint / .gguf with `model_path`), on
one pair of inputs (B = 1, T tokens; the corrupted one differs in one token), in one process:
- loop: seconds per patch, a median over `samples` patches timed one by one (each is one whole
  forward with a hook, the same work whichever patch it is), times the number of patches;
  `full_loop=True` runs the whole loop engine instead;
- batched: `patch(..., head_positions=True, engine="batched")`, median of `repeats` runs;
- attribution: `attribution_patch(...)`, median of `repeats` runs.
Times are CPU seconds of this process (`time.process_time`): with one thread, the work done,
whatever else the machine runs (wall time on a loaded shared machine swings by 3x between the
loop's samples and the batched runs). It checks the engines agree (the sampled patches'
fractions against the batched ones, or every entry with `full_loop`), and reports how well
attribution patching ranks the real effects: Pearson correlation over all entries and over the
top `top` by |real fraction|.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..hooked.ablation import replace_heads
from ..interpret import (
    PatchResult,
    act_name,
    attribution_patch,
    patch,
    run_with_cache,
    run_with_hooks,
)
from ..models.lm import CausalLM
from ..modules import LMConfig
from ..table import format_table
from .timing import environment

# SmolLM2-135M's shape (config.json of HuggingFaceTB/SmolLM2-135M)
SMOLLM2 = LMConfig(
    vocab_size=49152,
    dim=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    ffn_dim=1536,
    max_positions=8192,
    position="rope",
    norm="rmsnorm",
    mlp="swiglu",
    bias=False,
    rope_theta=100000.0,
)


def _model(model_path: str | None, layers: int | None) -> tuple[CausalLM, str]:
    if model_path is not None:
        from ..models import load_causal_lm

        loaded = load_causal_lm(model_path)
        return loaded.eval(), model_path
    cfg = SMOLLM2 if layers is None else LMConfig(**{**SMOLLM2.__dict__, "num_layers": layers})
    torch.manual_seed(0)
    name = "random SmolLM2-135M shape" + ("" if layers is None else f", {layers} layers")
    return CausalLM(cfg).eval(), name


def clock() -> float:
    """CPU seconds of this process: on one thread (--threads 1) the compute time, which other
    processes on a shared machine do not inflate (wall time would: see the module docstring)."""
    return time.process_time()


def _seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def _timed(fn: Callable[[], PatchResult]) -> tuple[PatchResult, float]:
    start = clock()
    result = fn()
    return result, clock() - start


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def run(
    *,
    model_path: str | None = None,
    layers: int | None = None,
    tokens: int = 9,
    repeats: int = 3,
    samples: int = 30,
    full_loop: bool = False,
    top: int = 20,
) -> str:
    model, name = _model(model_path, layers)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, V, (1, tokens), generator=g)
    corrupted = clean.clone()
    corrupted[0, tokens // 2] = (clean[0, tokens // 2] + 1) % V
    answer, wrong = int(clean[0, -1]), int(clean[0, 0])

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return (logits[:, -1, answer] - logits[:, -1, wrong]).mean()

    L, H = len(model.layers), model.config.num_heads
    patches = L * H * tokens
    rows: list[list[str]] = []
    with torch.no_grad():
        runs = [
            _timed(
                lambda: patch(
                    model, clean, corrupted, metric, heads=False, head_positions=True,
                    engine="batched",
                )
            )
            for _ in range(repeats)
        ]  # fmt: skip
        batched, t_batched = runs[0][0], statistics.median(t for _, t in runs)
        t_forward = _seconds(lambda: model(corrupted), max(repeats, 5))
    fast = batched.head_positions
    assert fast is not None
    if full_loop:
        start = clock()
        loop = patch(
            model, clean, corrupted, metric, heads=False, head_positions=True, engine="loop"
        )
        t_loop = clock() - start
        assert loop.head_positions is not None
        agree = float((loop.head_positions - fast).abs().max())
        how = "every patch run"
    else:  # one forward per patch costs the same whichever patch: time a sample of them
        pick = torch.Generator().manual_seed(2)
        difference = batched.clean - batched.corrupted
        per_patch, agree = [], 0.0
        with torch.no_grad():
            _, cache = run_with_cache(model, clean, names=lambda n: n.endswith("attn.hook_z"))
            for _ in range(samples):
                layer, head, pos = (
                    int(torch.randint(0, n, (1,), generator=pick)) for n in (L, H, tokens)
                )
                point = act_name("z", layer)
                fn = replace_heads([head], cache[point][:, :, [head]], positions=[pos])
                start = clock()
                out = run_with_hooks(model, corrupted, fwd_hooks=[(point, fn)])
                value = float(metric(out))
                per_patch.append(clock() - start)
                fraction = (value - batched.corrupted) / difference
                agree = max(agree, abs(fraction - float(fast[layer, head, pos])))
        t_loop = statistics.median(per_patch) * patches
        how = f"{samples} patches timed x {patches}"
    attr_runs = [
        _timed(
            lambda: attribution_patch(
                model, clean, corrupted, metric, heads=False, head_positions=True
            )
        )
        for _ in range(repeats)
    ]
    approx, t_attr = attr_runs[0][0], statistics.median(t for _, t in attr_runs)
    assert approx.head_positions is not None
    order = fast.flatten().abs().argsort(descending=True)[:top]
    corr_all = _pearson(approx.head_positions, fast)
    corr_top = _pearson(approx.head_positions.flatten()[order], fast.flatten()[order])

    rows.append(["one forward", f"{t_forward:.3f}", "", ""])
    rows.append([f"loop ({how})", f"{t_loop:.2f}", "1.00x", ""])
    rows.append(["batched", f"{t_batched:.2f}", f"{t_loop / t_batched:.2f}x", f"{agree:.1e}"])
    rows.append(["attribution (1 fwd + 1 bwd)", f"{t_attr:.2f}", f"{t_loop / t_attr:.1f}x", ""])
    env = environment("cpu")
    header = (
        f"patching every head at every position: {name}, {L} layers x {H} heads x {tokens} "
        f"positions = {patches} patches, B = 1\n"
        f"torch {env['torch']}, {env['threads']} thread(s), {env['cpu']}; CPU seconds of this "
        f"process, medians of {repeats}\n"
    )
    table = format_table(["engine", "seconds", "speed-up vs loop", "max |fraction - loop's|"], rows)
    tail = (
        f"\nattribution vs real patching: Pearson r = {corr_all:.3f} over all {patches} "
        f"entries, {corr_top:.3f} over the top {top} by |real fraction|"
    )
    return header + table + tail
