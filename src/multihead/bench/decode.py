"""`multihead bench decode`: greedy decoding on a GPT-2-small-shaped model (random weights), or
on a checkpoint directory (any model_type `load_causal_lm` reads, `run(model_dir=...)`).

Side by side in one process, on identical weights: multihead with its KV cache; the same model
recomputing the whole sequence at every step (timed at the prompt's length and at prompt + new
tokens, 128 and 384 by default: a full run would take many minutes here); and Hugging Face
transformers' `generate`. Also prints the floor set by memory bandwidth: weight bytes read per
step / measured read bandwidth.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from ..modules import CausalLM
from ..table import format_table
from .timing import environment


def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s for summing a large fp32 tensor (a read-dominated pass)."""
    x = torch.ones(megabytes * 2**20 // 4)
    x.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    return x.numel() * 4 / statistics.median(times)


def _models(layers: int, dim: int, heads: int, vocab: int, positions: int):
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
    return ours, hf


def _checkpoint_models(model_dir: str):
    """multihead and transformers on the same checkpoint directory, both in fp32."""
    import transformers

    from ..models import load_causal_lm

    ours = load_causal_lm(model_dir, dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return ours, hf.eval()


def _cached_steps(model: CausalLM, prompt: torch.Tensor, new: int) -> list[float]:
    """Seconds per decoding step (greedy, with the cache), prefill excluded."""
    B, P = prompt.shape
    times = []
    with torch.inference_mode():
        caches = model.make_caches(B, max_length=P + new)
        model._head_layout_for(B)  # as generate does
        token = model(prompt, caches=caches, last_only=True)[:, -1].argmax(-1)
        for _ in range(new - 1):
            start = time.perf_counter()
            token = model(token[:, None], caches=caches)[:, -1].argmax(-1)
            times.append(time.perf_counter() - start)
    return times


def _recompute_step(model: CausalLM, ids: torch.Tensor, repeats: int = 2) -> float:
    with torch.inference_mode():
        model(ids, last_only=True)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(ids, last_only=True)[:, -1].argmax(-1)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(
    *,
    batches=(1, 8),
    prompt_len: int = 128,
    new: int = 256,
    repeats: int = 2,
    model_dir: str | None = None,
) -> str:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ImportError(
            "multihead bench decode compares against transformers: pip install 'multihead[bench]'"
        ) from None
    if model_dir is None:
        layers, dim, heads, vocab = 12, 768, 12, 50257
        ours, hf = _models(layers, dim, heads, vocab, 1024)
        described = "GPT-2-small shape (12 x 12 heads x 768, vocab 50257, random weights)"
    else:
        ours, hf = _checkpoint_models(model_dir)
        c = ours.config
        vocab = c.vocab_size
        described = f"{model_dir} ({c.num_layers} x {c.num_heads} heads x {c.dim}, vocab {vocab})"
    weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())  # wte counted once
    bandwidth = read_bandwidth()
    floor_ms = weight_bytes / bandwidth * 1e3
    rows = []
    notes = []
    first, last = prompt_len, prompt_len + new  # the positions the two timings are taken at
    for B in batches:
        print(f"  batch {B}...", file=sys.stderr, flush=True)
        prompt = torch.randint(0, vocab, (B, prompt_len))
        ours_runs, hf_runs, per_step = [], [], []
        for _ in range(repeats):  # interleaved
            start = time.perf_counter()
            steps = _cached_steps(ours, prompt, new)
            ours_runs.append(time.perf_counter() - start)
            per_step.append(steps)
            start = time.perf_counter()
            with torch.inference_mode():
                out = hf.generate(
                    prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
                )
            hf_runs.append(time.perf_counter() - start)
            assert out.shape[1] == prompt_len + new
        ours_s, hf_s = statistics.median(ours_runs), statistics.median(hf_runs)
        steps = per_step[-1]
        early = statistics.median(steps[:8]) * 1e3  # positions ~prompt_len
        late = statistics.median(steps[-8:]) * 1e3  # positions ~prompt_len + new
        full = torch.randint(0, vocab, (B, prompt_len + new))
        rec_first = _recompute_step(ours, full[:, :prompt_len]) * 1e3
        rec_last = _recompute_step(ours, full) * 1e3
        rows.append(
            [
                str(B),
                f"{B * new / ours_s:.1f}",
                f"{B * new / hf_s:.1f}",
                f"{hf_s / ours_s:.2f}x",
                f"{early:.1f}",
                f"{late:.1f}",
                f"{late / early:.2f}",
                f"{rec_first:.0f} / {rec_last:.0f}",
                f"{floor_ms:.1f}",
            ]
        )
        notes.append(
            f"batch {B}: recomputing costs {rec_last / late:.0f}x the cached step at position "
            f"{last}"
        )
    env = environment()
    return "\n".join(
        [
            f"multihead bench decode: greedy, {described}, "
            f"prompt {prompt_len}, {new} new tokens, {repeats} interleaved runs; "
            + ", ".join(f"{k} {v}" for k, v in env.items()),
            f"weights {weight_bytes / 2**20:.0f} MiB fp32; measured read bandwidth "
            f"{bandwidth / 1e9:.1f} GB/s -> memory floor {floor_ms:.1f} ms per step",
            "",
            format_table(
                [
                    "batch",
                    "multihead tok/s",
                    "HF tok/s",
                    "speed-up",
                    f"ms/step @{first}",
                    f"ms/step @{last}",
                    f"@{last}/@{first}",
                    f"recompute ms @{first}/@{last}",
                    "floor ms",
                ],
                rows,
            ),
            "",
            *notes,
        ]
    )
