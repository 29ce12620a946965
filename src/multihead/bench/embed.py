"""`multihead bench embed`: sentence embeddings with multihead vs sentence-transformers and ONNX
Runtime (an exported BertModel, every graph optimisation, the same intra-op threads; see
`onnx_peer`).

All encode the same texts with the same model directory, alternating run by run in one
process; we report seconds, texts/s, each peer's time as a multiple of multihead's, and the
minimum cosine between the outputs. Two corpora: "short", `n` standard-library docstring
sentences of at most 20 tokens (13 on average with MiniLM's tokenizer), and "long", docstring
sentences joined into texts of about 241 tokens (`n` / 16 texts, at least 8).
"""

from __future__ import annotations

import functools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..table import format_table
from .corpus import stdlib_sentences
from .timing import dtype_name, environment, measure_rounds, resolve_device, resolve_dtype

CORPORA = ("short", "long")
SHORT_TOKENS = 20  # the short texts' longest (their mean is then ~13, as in issue 25)
LONG_TOKENS = 241  # the long texts' target length


def long_texts(sentences: list[str], lengths: list[int], count: int) -> list[str]:
    """`count` texts of consecutive sentences joined until each reaches LONG_TOKENS tokens
    (counted from the sentences' own token counts; the sentences are reused in turn)."""
    texts: list[str] = []
    parts: list[str] = []
    tokens, i = 0, 0
    while len(texts) < count:
        parts.append(sentences[i % len(sentences)])
        tokens += lengths[i % len(sentences)] - 2  # less [CLS] / [SEP] of each sentence
        i += 1
        if tokens >= LONG_TOKENS - 2:
            texts.append(" ".join(parts))
            parts, tokens = [], 0
    return texts


def _cosines(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def run(
    model: str = "all-MiniLM-L6-v2",
    *,
    n: int = 2000,
    batch_size: int = 32,
    repeats: int = 3,
    device: str = "cpu",
    dtype: str = "fp32",
    corpora: tuple[str, ...] = CORPORA,
    onnx: bool = True,
) -> str:
    """The table. `device`: "cpu" or "cuda" (timed with synchronisation); `dtype`: "fp32",
    "bf16" or "fp16" (both torch encoders' weights). `corpora`: "short" and/or "long".
    `onnx`: add the ONNX Runtime peer (CPU, fp32 only; left out, with a note, elsewhere or
    when onnxruntime / onnxscript are not installed)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ImportError(
            "multihead bench embed compares against sentence-transformers: "
            "pip install 'multihead[bench]'"
        ) from None
    from ..pretrained import load_encoder
    from . import onnx_peer

    unknown = [c for c in corpora if c not in CORPORA]
    if unknown or not corpora:
        raise ValueError(f"corpora must be among {CORPORA}, got {corpora!r}")
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    ours = load_encoder(model).to(device=dev, dtype=dt)
    theirs = SentenceTransformer(str(Path(ours.source or model)), device=str(dev)).to(dt)
    notes: list[str] = []
    contenders: dict[str, Callable[[list[str]], Any]] = {
        "multihead": lambda texts: ours.encode(texts, batch_size=batch_size),
        "sentence-transformers": lambda texts: theirs.encode(texts, batch_size=batch_size),
    }
    if onnx:
        absent = onnx_peer.missing()
        if absent:
            notes.append(f"onnxruntime: left out ({', '.join(absent)} not installed)")
        elif dev.type != "cpu" or dt != torch.float32:
            notes.append("onnxruntime: left out (it runs here on CPU in fp32 only)")
        else:
            print("  exporting the model to ONNX...", file=sys.stderr, flush=True)
            peer = onnx_peer.OnnxEncoder(ours)
            contenders["onnxruntime"] = lambda texts: peer.encode(texts, batch_size=batch_size)
            notes.append(
                f"onnxruntime: torch.onnx.export(dynamo=True) of the transformers model, "
                f"ORT_ENABLE_ALL, {peer.threads} intra-op threads"
            )

    sentences = stdlib_sentences(4 * n)
    lengths = [len(x) for x in ours.tokenize(sentences)]
    short = [s for s, length in zip(sentences, lengths, strict=True) if length <= SHORT_TOKENS]
    if len(short) < n:
        raise ValueError(f"the corpus has {len(short)} sentences of <= {SHORT_TOKENS} tokens")
    texts = {"short": short[:n], "long": long_texts(sentences, lengths, max(8, n // 16))}
    rows: list[list[str]] = []
    summary: list[str] = []
    for corpus in corpora:
        batch = texts[corpus]
        tokens = [len(x) for x in ours.tokenize(batch)]
        outputs = {name: np.asarray(fn(batch)) for name, fn in contenders.items()}
        print(f"  timing ({corpus} texts; each run encodes them all)...", file=sys.stderr)
        rounds = measure_rounds(
            {name: functools.partial(fn, batch) for name, fn in contenders.items()},
            repeats=repeats,
            warmup=0,
            min_time=0.0,
            device=dev,
        )
        seconds = {name: statistics.median(s) for name, s in rounds.items()}
        for name, s in seconds.items():
            cos = _cosines(outputs[name], outputs["multihead"])
            rows.append(
                [
                    corpus,
                    name,
                    f"{s:.2f}",
                    f"{len(batch) / s:.1f}",
                    f"{s / seconds['multihead']:.2f}x",
                    "-" if name == "multihead" else f"{cos:.7f}",
                ]
            )
        description = (
            f"{n} standard-library docstring sentences of <= {SHORT_TOKENS} tokens"
            if corpus == "short"
            else f"{len(batch)} texts of joined sentences"
        )
        summary.append(
            f"{corpus}: {description}, {sum(tokens)} tokens "
            f"(mean {np.mean(tokens):.1f}, max {max(tokens)})"
        )
        for peer_name in [c for c in contenders if c != "multihead"]:
            per_round = [p / m for m, p in zip(rounds["multihead"], rounds[peer_name], strict=True)]
            summary.append(
                f"  speed-up vs {peer_name}: {seconds[peer_name] / seconds['multihead']:.2f}x "
                f"(ratio of medians; within a round: {min(per_round):.2f}x to "
                f"{max(per_round):.2f}x); agreement: min cosine "
                f"{_cosines(outputs['multihead'], outputs[peer_name]):.7f}, max |difference| "
                f"{np.abs(outputs['multihead'] - outputs[peer_name]).max():.2e}"
            )
    env = environment(dev)
    return "\n".join(
        [
            f"multihead bench embed: medians of interleaved runs, {dtype_name(dt)}; "
            + ", ".join(f"{k} {v}" for k, v in env.items()),
            f"model {model}; batch_size {batch_size}; {repeats} runs each",
            *summary,
            *notes,
            "",
            format_table(
                ["texts", "encoder", "seconds", "texts/s", "time vs multihead", "min cosine"],
                rows,
            ),
        ]
    )
