"""`multihead bench bridge`: a transformers model's forward through the bridge (multihead's
attention inside transformers' modules, hooks off) vs the same model on transformers' own sdpa
attention, side by side in one process.

For each architecture, two copies of one randomly initialised transformers model: "sdpa"
(`attn_implementation="sdpa"`, transformers' default) and "bridged" (`multihead.wrap`). Both run
the same input under `torch.no_grad()` in eval mode, in a fresh random order each round; the
ratio is the median over rounds of bridged / sdpa, each pair from the same round. On CPU each
sample is this process's CPU time (`time.process_time`): on a shared machine other processes
inflate wall time by several times and unevenly (with `--threads 1` it is the work done); on
CUDA, CUDA events (`bench.timing.measure_rounds`). The outputs are checked to agree first.
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from typing import Any

import torch

from ..table import format_table
from .timing import (
    dtype_name,
    environment,
    measure_rounds,
    median_ratio,
    resolve_device,
    resolve_dtype,
)

# architecture -> (config class, model class, extra config); sizes are `_config`'s
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"num_key_value_heads": 2}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {"num_key_value_heads": 2}),
}
DEFAULT = ("llama", "gpt_neox")


def _model(
    arch: str, dim: int, layers: int, heads: int, device: torch.device, dtype: torch.dtype
) -> Any:
    import transformers

    config_name, model_name, extra = ARCHITECTURES[arch]
    config = getattr(transformers, config_name)(
        vocab_size=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        hidden_size=dim,
        intermediate_size=dim * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=4096,
        **extra,
    )
    torch.manual_seed(0)
    model_cls = getattr(transformers, model_name)
    model = model_cls._from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.to(device).eval()


def _cpu_rounds(contenders: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    """CPU seconds per call of each contender in each round (random order per round)."""
    for fn in contenders.values():
        fn()
        fn()
    start = time.process_time()
    next(iter(contenders.values()))()
    loops = max(1, int(0.05 / max(time.process_time() - start, 1e-4)))
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    order_rng = random.Random(0)
    for _ in range(repeats):
        order = list(contenders)
        order_rng.shuffle(order)
        for name in order:
            start = time.process_time()
            for _ in range(loops):
                contenders[name]()
            samples[name].append((time.process_time() - start) / loops)
    return samples


def _row(
    arch: str,
    dim: int,
    layers: int,
    heads: int,
    tokens: int,
    batch: int,
    repeats: int,
    device: torch.device,
    dtype: torch.dtype,
) -> list[str]:
    """One architecture timed: its table row."""
    from ..bridge import wrap

    sdpa = _model(arch, dim, layers, heads, device, dtype)
    bridged = wrap(copy.deepcopy(sdpa))
    ids = torch.randint(0, 2048, (batch, tokens), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    with torch.no_grad():
        want = sdpa(ids, use_cache=False).logits.float()
        got = bridged(ids).float()
    gap = float((want - got).abs().max())
    if gap > (1e-3 if dtype == torch.float32 else 0.1 * float(want.abs().max())):
        raise RuntimeError(f"{arch}: bridged and sdpa logits differ by {gap:.2e}")

    def plain() -> None:
        with torch.no_grad():
            sdpa(ids, use_cache=False)

    def through() -> None:
        with torch.no_grad():
            bridged(ids)

    samples = measure_rounds({"sdpa": plain, "bridged": through}, repeats=repeats, device=device)
    ratio = median_ratio(samples["bridged"], samples["sdpa"])
    return [
        arch,
        f"{statistics.median(samples['sdpa']) * 1e3:.2f}",
        f"{statistics.median(samples['bridged']) * 1e3:.2f}",
        f"{ratio:.3f}x",
        f"{gap:.1e}",
    ]


def run(
    archs: tuple[str, ...] = DEFAULT,
    *,
    dim: int = 256,
    layers: int = 4,
    heads: int = 8,
    tokens: int = 256,
    batch: int = 1,
    repeats: int = 9,
    device: str = "cpu",
    dtype: str = "fp32",
) -> str:
    unknown = [a for a in archs if a not in ARCHITECTURES]
    if unknown:
        raise ValueError(f"unknown architecture {unknown[0]!r}; known: {', '.join(ARCHITECTURES)}")
    where, kind = resolve_device(device), resolve_dtype(dtype)
    rows = [_row(arch, dim, layers, heads, tokens, batch, repeats, where, kind) for arch in archs]
    env = environment(where)
    head = (
        f"bridged forward vs transformers' sdpa forward (hooks off), {dtype_name(kind)}, "
        f"{'CUDA events' if where.type == 'cuda' else 'CPU time of this process'}: "
        f"B={batch} T={tokens}, "
        f"hidden {dim}, {layers} layers, {heads} heads; medians of {repeats} rounds\n"
        + ", ".join(f"{k} {v}" for k, v in env.items())
    )
    table = format_table(["model", "sdpa ms", "bridged ms", "bridged/sdpa", "max |diff|"], rows)
    return head + "\n" + table
