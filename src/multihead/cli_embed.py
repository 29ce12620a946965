"""`multihead embed` and `multihead similarity`: sentence embeddings from the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_commands(commands) -> None:
    embed = commands.add_parser(
        "embed",
        help="embed sentences (arguments, a file with one per line, or stdin)",
        description="Embed sentences with a pretrained encoder and write .npy or JSON lines.",
    )
    embed.add_argument("sentences", nargs="*", help="sentences to embed (else --file or stdin)")
    embed.add_argument("-f", "--file", type=Path, help="text file, one sentence per line")
    embed.add_argument("--model", default="all-MiniLM-L6-v2", help="model name or directory")
    embed.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="encode's batch_size: bounds memory, as in sentence-transformers (default 32)",
    )
    embed.add_argument("--max-seq-length", type=int, default=None)
    embed.add_argument(
        "--format",
        choices=["npy", "jsonl"],
        help="output format (default: from the -o suffix, else jsonl)",
    )
    embed.add_argument("-o", "--output", type=Path, help="output file (default: stdout, jsonl)")

    sim = commands.add_parser("similarity", help="cosine similarity of two sentences")
    sim.add_argument("a")
    sim.add_argument("b")
    sim.add_argument("--model", default="all-MiniLM-L6-v2", help="model name or directory")


def _read_sentences(args) -> list[str]:
    if args.sentences and args.file:
        raise SystemExit("multihead embed: give sentences as arguments or --file, not both")
    if args.sentences:
        return list(args.sentences)
    if args.file:
        try:
            text = args.file.read_text(encoding="utf-8")
        except OSError as e:
            raise SystemExit(f"multihead embed: cannot read {str(args.file)!r}: {e}") from None
    elif not sys.stdin.isatty():
        text = sys.stdin.read()
    else:
        raise SystemExit("multihead embed: no sentences (pass them as arguments, --file or stdin)")
    return [line for line in text.splitlines() if line.strip()]


def run_embed(args) -> int:
    import numpy as np

    from .pretrained import load_encoder

    sentences = _read_sentences(args)
    fmt = args.format or ("npy" if args.output and args.output.suffix == ".npy" else "jsonl")
    if fmt == "npy" and args.output is None:
        raise SystemExit("multihead embed: --format npy needs -o PATH")
    if args.batch_size < 1:
        raise SystemExit(f"multihead embed: --batch-size must be >= 1, got {args.batch_size}")
    encoder = load_encoder(args.model)
    vectors = encoder.encode(
        sentences,
        batch_size=args.batch_size,
        max_seq_length=args.max_seq_length,
        show_progress_bar=len(sentences) >= 512 and sys.stderr.isatty(),
    )
    if fmt == "npy":
        np.save(args.output, vectors)
        print(f"wrote {vectors.shape[0]} x {vectors.shape[1]} embeddings to {args.output}")
        return 0
    lines = (
        json.dumps({"text": s, "embedding": [round(float(x), 7) for x in v]}, ensure_ascii=False)
        for s, v in zip(sentences, vectors, strict=True)
    )
    if args.output is None:
        for line in lines:
            print(line)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
        print(f"wrote {len(sentences)} embeddings to {args.output}")
    return 0


def run_similarity(args) -> int:
    import numpy as np

    from .pretrained import load_encoder

    a, b = load_encoder(args.model).encode([args.a, args.b])
    cosine = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
    print(f"{cosine:.4f}")
    return 0
