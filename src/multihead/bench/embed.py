"""`multihead bench embed`: sentence embeddings with multihead vs sentence-transformers.

Both encode the same corpus (2,000 standard-library docstring sentences by default) with the
same model directory, alternating run by run in one process; we report sentences/s, the ratio
and the minimum cosine between the two outputs.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

from ..table import format_table
from .corpus import stdlib_sentences
from .timing import dtype_name, environment, measure_rounds, resolve_device, resolve_dtype


def run(
    model: str = "all-MiniLM-L6-v2",
    *,
    n: int = 2000,
    batch_size: int = 32,
    repeats: int = 3,
    device: str = "cpu",
    dtype: str = "fp32",
) -> str:
    """The table. `device`: "cpu" or "cuda" (timed with synchronisation); `dtype`: "fp32",
    "bf16" or "fp16" (both encoders' weights)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ImportError(
            "multihead bench embed compares against sentence-transformers: "
            "pip install 'multihead[bench]'"
        ) from None
    from ..pretrained import load_encoder

    dev, dt = resolve_device(device), resolve_dtype(dtype)
    ours = load_encoder(model).to(device=dev, dtype=dt)
    theirs = SentenceTransformer(str(Path(ours.source or model)), device=str(dev)).to(dt)
    corpus = stdlib_sentences(n)
    lengths = [len(x) for x in ours.tokenize(corpus)]

    a = ours.encode(corpus, batch_size=batch_size)
    b = theirs.encode(corpus, batch_size=batch_size)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    print("  timing (each run encodes the whole corpus)...", file=sys.stderr, flush=True)
    rounds = measure_rounds(
        {
            "multihead": lambda: ours.encode(corpus, batch_size=batch_size),
            "sentence-transformers": lambda: theirs.encode(corpus, batch_size=batch_size),
        },
        repeats=repeats,
        warmup=0,
        min_time=0.0,
        device=dev,
    )
    seconds = {name: statistics.median(s) for name, s in rounds.items()}
    rows = [[name, f"{s:.2f}", f"{n / s:.1f}"] for name, s in seconds.items()]
    ratio = seconds["sentence-transformers"] / seconds["multihead"]
    per_round = [
        theirs / ours
        for ours, theirs in zip(rounds["multihead"], rounds["sentence-transformers"], strict=True)
    ]
    env = environment(dev)
    return "\n".join(
        [
            f"multihead bench embed: medians of interleaved runs, {dtype_name(dt)}; "
            + ", ".join(f"{k} {v}" for k, v in env.items()),
            f"model {model}; corpus: {n} standard-library docstring sentences, "
            f"{sum(lengths)} tokens (mean {np.mean(lengths):.1f}, max {max(lengths)}); "
            f"batch_size {batch_size}; {repeats} runs each",
            "",
            format_table(["encoder", "seconds", "sentences/s"], rows),
            "",
            f"speed-up: {ratio:.2f}x sentence-transformers (ratio of medians; within a round: "
            f"{min(per_round):.2f}x to {max(per_round):.2f}x)",
            f"agreement: min cosine {cos.min():.7f}, max |difference| {np.abs(a - b).max():.2e}",
        ]
    )
