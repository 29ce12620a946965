"""`multihead embed`: sentence embeddings from the command line, as JSON lines, .npy or .npz."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from .errors import UsageError
from .inputs import check_text_argument, lines_of, read_stdin, read_text_file
from .model_dir import DEFAULT_MODEL, check_model, load_sentence_encoder
from .outputs import check_writable, output_format, write_atomic
from .parsing import positive_int
from .progress import Progress

NAME = "embed"
HELP = "embed sentences (arguments, a file with one per line, or stdin)"
DESCRIPTION = (
    "Embed sentences with a pretrained encoder. Output: JSON lines (on stdout by default), "
    ".npy (an N x dim float32 array) or .npz (arrays 'embeddings' and 'texts'), chosen by "
    "--format or the -o suffix."
)
FORMATS = ("jsonl", "npy", "npz")


def add_arguments(parser) -> None:
    parser.add_argument("sentences", nargs="*", help="sentences to embed (else --file or stdin)")
    parser.add_argument("-f", "--file", type=Path, help="UTF-8 text file, one sentence per line")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"model directory or name (default {DEFAULT_MODEL})"
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=32,
        help="encode's batch_size: bounds memory, as in sentence-transformers (default 32)",
    )
    parser.add_argument(
        "--max-seq-length",
        type=positive_int,
        metavar="N",
        help="cut each sentence to N tokens (default: the model's own, 256 for MiniLM)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help="output format (default: from the -o suffix, else jsonl)",
    )
    parser.add_argument("-o", "--output", type=Path, help="output file (default: stdout, jsonl)")


def _read_sentences(args) -> list[str]:
    if args.sentences and args.file:
        raise UsageError("give sentences as arguments or --file, not both")
    if args.sentences:
        sentences = [
            check_text_argument(s, f"sentence {i}") for i, s in enumerate(args.sentences, 1)
        ]
        if not any(s.strip() for s in sentences):
            raise UsageError("the sentences given are all empty")
        return sentences
    if args.file:
        sentences = lines_of(read_text_file(args.file, "--file"))
        if not sentences:
            raise UsageError(f"--file {str(args.file)!r} holds no text (only blank lines)")
        return sentences
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("no sentences: pass them as arguments, with --file, or on stdin")
    sentences = lines_of(read_stdin())
    if not sentences:
        raise UsageError("no sentences: stdin was empty (or only blank lines)")
    return sentences


def run(args) -> int:
    fmt = output_format(args.output, args.format, FORMATS, default="jsonl")
    if fmt != "jsonl" and args.output is None:
        raise UsageError(f"--format {fmt} writes a binary file: give -o PATH")
    if args.output is not None:
        check_writable(args.output)
    sentences = _read_sentences(args)
    progress = Progress()
    progress.status(f"loading {args.model}…")
    model = check_model(args.model)
    model.check_length(args.max_seq_length, "--max-seq-length")
    encoder = load_sentence_encoder(model, NAME)
    progress.done()
    vectors = encoder.encode(
        sentences,
        batch_size=args.batch_size,
        max_seq_length=args.max_seq_length,
        show_progress_bar=progress.enabled and len(sentences) >= 256,
    )
    if args.output is None:
        for line in _jsonl(sentences, vectors):
            print(line)
        return 0
    write_atomic(args.output, lambda f: _write(f, fmt, sentences, vectors))
    n, dim = vectors.shape
    print(f"wrote {n} x {dim} embeddings ({fmt}) to {args.output}")
    return 0


def _jsonl(sentences, vectors):
    for s, v in zip(sentences, vectors, strict=True):
        embedding = [round(float(x), 7) for x in v]
        yield json.dumps({"text": s, "embedding": embedding}, ensure_ascii=False)


def _write(f, fmt: str, sentences: list[str], vectors) -> None:
    import numpy as np

    if fmt == "npy":
        np.save(f, vectors)
    elif fmt == "npz":
        np.savez(f, embeddings=vectors, texts=np.array(sentences, dtype=str))
    else:
        text = io.TextIOWrapper(f, encoding="utf-8", newline="\n")
        for line in _jsonl(sentences, vectors):
            text.write(line + "\n")
        text.flush()
        text.detach()
