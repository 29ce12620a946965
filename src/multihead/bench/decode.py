"""`multihead bench decode`: greedy decoding on a GPT-2-small-shaped model (random weights), or
on a checkpoint directory (any model_type `load_causal_lm` reads, `run(model_dir=...)`).

Side by side in one process, on identical weights, each a whole `generate` call (prefill
included), rounds interleaved: multihead eager (KV cache), multihead `generate(compile=True)`
(static cache; a CUDA graph per step on CUDA), Hugging Face transformers' GPT-2 `generate`
(dynamic cache) and with its static cache (which `generate` compiles itself on CUDA; on CPU
only when asked, `hf_compile=True`). Compilation is done before the timed rounds and reported
apart. Also: multihead's time per step early and late in the sequence, the same model
recomputing the whole sequence per step, and the floor set by memory bandwidth (weight bytes
read per step / measured read bandwidth of this device).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

from ..modules import CausalLM
from ..modules import generation as gen
from ..table import format_table
from .timing import (
    dtype_name,
    environment,
    measure_rounds,
    resolve_device,
    resolve_dtype,
    synchronize,
    timed,
)


def read_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s for summing a large fp32 tensor on `device` (a read-dominated pass)."""
    x = torch.ones(megabytes * 2**20 // 4, device=device)
    x.sum()
    seconds = statistics.median(timed(x.sum, 1, device) for _ in range(repeats))
    return x.numel() * 4 / seconds


def _models(layers: int, dim: int, heads: int, vocab: int, positions: int, device, dtype):
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=heads, n_positions=positions
    )
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    from ..models.checkpoint import StateDictCheckpoint
    from ..models.gpt2 import GPT2
    from ..models.loading import load_model

    state = StateDictCheckpoint(hf.state_dict())
    ours = load_model(GPT2, cfg.to_dict() | {"model_type": "gpt2"}, state, dtype=torch.float32)
    assert isinstance(ours, CausalLM)
    return ours.eval().to(device=device, dtype=dtype), hf.to(device=device, dtype=dtype)


def _checkpoint_models(model_dir: str, device, dtype):
    """multihead and transformers on the same checkpoint directory."""
    import transformers

    from ..models import load_causal_lm

    ours = load_causal_lm(model_dir, dtype=dtype, device=device)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return ours.eval(), hf.eval().to(device)


def _step_ms(
    model: CausalLM, prompt: torch.Tensor, new: int, window: int = 8
) -> tuple[float, float]:
    """ms per eager decoding step (greedy, with the cache) over the first and the last `window`
    steps: at positions ~P and ~P + new."""
    B, P = prompt.shape
    device = prompt.device
    window = max(1, min(window, (new - 1) // 2))  # short runs: both windows fit in `new` steps
    with torch.inference_mode():
        caches = model.make_caches(B, max_length=P + new)
        head = gen.head_copy_for(model, B, new)
        token = gen._prefill(model, prompt, None, None, caches, head).argmax(-1)
        positions = torch.full((B,), P, device=device)

        def step() -> None:
            nonlocal token, positions
            logits = gen._decode(model, token[:, None], positions[:, None], caches, head)
            token, positions = logits.argmax(-1), positions + 1

        early = timed(step, window, device)
        for _ in range(new - 1 - 2 * window):
            step()
        late = timed(step, window, device)
    return early * 1e3, late * 1e3


def _recompute_ms(model: CausalLM, ids: torch.Tensor, repeats: int = 2) -> float:
    with torch.inference_mode():
        model(ids, last_only=True)
        run = lambda: model(ids, last_only=True)[:, -1].argmax(-1)  # noqa: E731
        return statistics.median(timed(run, 1, ids.device) for _ in range(repeats)) * 1e3


def _hf_generate(hf, prompt: torch.Tensor, new: int, **kwargs) -> Callable[[], object]:
    def run() -> object:
        with torch.inference_mode():
            out = hf.generate(
                prompt,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                **kwargs,
            )
        assert out.shape[1] == prompt.shape[1] + new
        return out

    return run


def run(
    *,
    batches=(1, 8),
    prompt_len: int = 128,
    new: int = 256,
    repeats: int = 2,
    device: str = "cpu",
    dtype: str = "fp32",
    compile: bool = True,
    hf_static: bool = True,
    hf_compile: bool | None = None,
    model_dir: str | None = None,
) -> str:
    """The table. `device` "cpu" or "cuda" (timed with CUDA events); `dtype` "fp32", "bf16" or
    "fp16". `compile`: add multihead's `generate(compile=True)`. `hf_static`: add Hugging Face
    with its static cache; `hf_compile`: compile it (default: where `generate` does by itself,
    CUDA; on CPU it takes minutes). `model_dir`: a decoder checkpoint instead of the random
    GPT-2-small-shaped model."""
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "multihead bench decode compares against transformers: pip install 'multihead[bench]'"
        ) from None
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    hf_compile = dev.type == "cuda" if hf_compile is None else hf_compile
    if model_dir is None:
        layers, dim, heads, vocab = 12, 768, 12, 50257
        ours, hf = _models(layers, dim, heads, vocab, 1024, dev, dt)
        described = "GPT-2-small shape (12 x 12 heads x 768, vocab 50257, random weights)"
    else:
        ours, hf = _checkpoint_models(model_dir, dev, dt)
        c = ours.config
        vocab = c.vocab_size
        described = f"{model_dir} ({c.num_layers} x {c.num_heads} heads x {c.dim}, vocab {vocab})"
    weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())  # wte counted once
    bandwidth = read_bandwidth(dev)
    floor_ms = weight_bytes / bandwidth * 1e3
    static_name = "HF static+compile" if hf_compile else "HF static"
    static_kwargs: dict[str, object] = {"cache_implementation": "static"}
    if hf_compile and dev.type != "cuda":  # transformers compiles on CUDA only, unless told
        config = transformers.CompileConfig()
        config._compile_all_devices = True  # type: ignore[assignment]
        static_kwargs["compile_config"] = config
    elif not hf_compile:
        static_kwargs["disable_compile"] = True
    rows, notes = [], []
    for B in batches:
        print(f"  batch {B}...", file=sys.stderr, flush=True)
        prompt = torch.randint(0, vocab, (B, prompt_len), device=dev)
        contenders: dict[str, Callable[[], object]] = {
            "multihead": lambda: ours.generate(prompt, new),  # noqa: B023
            "HF": _hf_generate(hf, prompt, new),
        }
        if compile:
            contenders["multihead compiled"] = lambda: ours.generate(prompt, new, compile=True)  # noqa: B023
        if hf_static:
            contenders[static_name] = _hf_generate(hf, prompt, new, **static_kwargs)
        warm = {}
        for name in ("multihead compiled", static_name):  # compilation, outside the rounds
            if name in contenders:
                start = time.perf_counter()
                contenders[name]()
                synchronize(dev)
                warm[name] = time.perf_counter() - start
        rounds = measure_rounds(contenders, repeats=repeats, warmup=0, min_time=0.0, device=dev)
        seconds = {name: statistics.median(s) for name, s in rounds.items()}
        tok_s = {name: B * new / s for name, s in seconds.items()}
        early, late = _step_ms(ours, prompt, new)
        full = torch.randint(0, vocab, (B, prompt_len + new), device=dev)
        rec_early = _recompute_ms(ours, full[:, :prompt_len])
        rec_late = _recompute_ms(ours, full)
        row = [str(B), f"{tok_s['multihead']:.1f}"]
        row += [f"{tok_s['multihead compiled']:.1f}"] if compile else []
        row += [f"{tok_s['HF']:.1f}"] + ([f"{tok_s[static_name]:.1f}"] if hf_static else [])
        row += [f"{seconds['HF'] / seconds['multihead']:.2f}x"]
        if compile:
            best = min(seconds["multihead"], seconds["multihead compiled"])
            row += [f"{seconds['multihead compiled'] / seconds['multihead']:.2f}"]
            if hf_static:
                row += [f"{seconds[static_name] / best:.2f}x"]
        row += [f"{early:.2f}", f"{late:.2f}", f"{late / early:.2f}"]
        row += [f"{rec_early:.0f} / {rec_late:.0f}"]
        rows.append(row)
        notes.append(
            f"batch {B}: recomputing costs {rec_late / late:.0f}x the cached step at position "
            f"{prompt_len + new}; warm-up (compilation) "
            + ", ".join(f"{name} {s:.0f} s" for name, s in warm.items())
        )
    headers = ["batch", "multihead tok/s"]
    headers += ["compiled tok/s"] if compile else []
    headers += ["HF tok/s"] + ([f"{static_name} tok/s"] if hf_static else [])
    headers += ["speed-up vs HF"]
    if compile:
        headers += ["compiled/eager time"] + ([f"best vs {static_name}"] if hf_static else [])
    first, last = prompt_len, prompt_len + new  # the positions the step timings are taken at
    headers += [f"ms/step @{first}", f"ms/step @{last}", f"@{last}/@{first}"]
    headers += [f"recompute ms @{first}/@{last}"]
    env = environment(dev)
    return "\n".join(
        [
            f"multihead bench decode: greedy, {described}, "
            f"{dtype_name(dt)}, prompt {prompt_len}, {new} new tokens, "
            f"{repeats} interleaved runs of whole generate calls; "
            + ", ".join(f"{k} {v}" for k, v in env.items()),
            f"weights {weight_bytes / 2**20:.0f} MiB {dtype_name(dt)}; measured read bandwidth "
            f"{bandwidth / 1e9:.1f} GB/s -> memory floor {floor_ms:.2f} ms per step",
            "speed-up vs HF: HF time / multihead (eager) time; compiled/eager: below 1 the "
            "compiled path is faster; best vs HF static: its time / multihead's best",
            "",
            format_table(headers, rows),
            "",
            *notes,
        ]
    )
