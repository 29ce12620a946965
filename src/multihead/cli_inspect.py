"""`multihead inspect` and `multihead heads`: what every head of a real model attends to."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .table import format_table

FORMATS = ("html", "png", "json")


def add_commands(commands) -> None:
    ins = commands.add_parser(
        "inspect",
        help="show what every head of a model attends to in TEXT, and write a report",
        description="Run the model on TEXT, print the most clearly specialised heads with their "
        "measured roles, and write a report (HTML by default).",
    )
    ins.add_argument("text")
    ins.add_argument("--model", default="all-MiniLM-L6-v2", help="model name or directory")
    ins.add_argument("--layer", type=int, help="focus one head: its layer (with --head)")
    ins.add_argument("--head", type=int, help="focus one head: its index (with --layer)")
    ins.add_argument("--format", default="html", help="html (default), png or json")
    ins.add_argument(
        "-o", "--output", type=Path, help="report path (default ./multihead-inspect.FORMAT)"
    )
    ins.add_argument("--top", type=int, default=12, help="heads in the printed table")

    heads = commands.add_parser("heads", help="head metrics (and importance) over a corpus")
    heads.add_argument("--corpus", type=Path, required=True, help="text file, one text per line")
    heads.add_argument("--model", default="all-MiniLM-L6-v2", help="model name or directory")
    heads.add_argument("--metrics", nargs="+", help="metric columns (default: a useful set)")
    heads.add_argument("--top", type=int, default=20, help="rows, most specialised heads first")
    heads.add_argument("--importance", action="store_true", help="add ablation importance")


def _fail(message: str) -> int:
    print(f"multihead: error: {message}", file=sys.stderr)
    return 2


def _check_output(path: Path) -> str | None:
    directory = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        return f"output path {str(path)!r} is a directory"
    if not directory.is_dir():
        return f"cannot write {str(path)!r}: directory {str(directory)!r} does not exist"
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"cannot write {str(path)!r}: permission denied"
    return None


def run_inspect(args) -> int:
    if not args.text.strip():
        return _fail("TEXT is empty; give a sentence to inspect")
    if args.format not in FORMATS:
        return _fail(f"unknown format {args.format!r}; choose one of {', '.join(FORMATS)}")
    if (args.layer is None) != (args.head is None):
        return _fail("--layer and --head go together")
    output = args.output or Path(f"multihead-inspect.{args.format}")
    problem = _check_output(output)
    if problem:
        return _fail(problem)

    from .interpret.analysis import analyze
    from .interpret.roles import strongest
    from .pretrained import load_encoder

    encoder = load_encoder(args.model)
    L, H = len(encoder.model.layers), encoder.model.config.num_attention_heads
    if args.layer is not None and not (0 <= args.layer < L and 0 <= args.head < H):
        return _fail(
            f"--layer {args.layer} --head {args.head} is out of range: layers 0..{L - 1}, "
            f"heads 0..{H - 1}"
        )
    analysis = analyze(encoder, [args.text])
    tokens = analysis.texts[0].tokens
    print(f"{args.model}: {L} layers x {H} heads, {len(tokens)} tokens: {' '.join(tokens)}")
    best = strongest(analysis.roles, args.top)
    rows = [[f"L{r.layer} H{r.head}", r.role, r.description] for r in best]
    if rows:
        print(format_table(["head", "role", "measured"], rows, left=(0, 1, 2)))
    clear = sum(1 for row in analysis.roles for roles in row if roles)
    print(f"{clear} of {L * H} heads pass a role threshold; the rest have no clear role here.")
    if args.layer is not None:
        roles = analysis.roles[args.layer][args.head]
        summary = "; ".join(str(r) for r in roles) if roles else "no clear role"
        print(f"L{args.layer} H{args.head}: {summary}")

    title = f"{args.model}: {args.text}"
    focus = (args.layer, args.head) if args.layer is not None else None
    if args.format == "html":
        from .interpret.report_html import write_html

        write_html(analysis, output, title=title, open_head=focus)
    elif args.format == "png":
        from .interpret import report_png

        if focus:
            report_png.head_png(analysis, focus[0], focus[1], output)
        else:
            report_png.grid_png(analysis, output, title=title)
    else:
        from .interpret.report_json import to_json

        output.write_text(to_json(analysis, model=args.model), encoding="utf-8")
    print(f"report: {output.resolve()}")
    return 0


DEFAULT_COLUMNS = (
    "previous",
    "next",
    "self",
    "positional",
    "special",
    "punctuation",
    "entropy_norm",
    "duplicate",
    "induction",
)


def run_heads(args) -> int:
    from .interpret.metrics import METRIC_NAMES

    columns = list(args.metrics or DEFAULT_COLUMNS)
    unknown = [m for m in columns if m not in METRIC_NAMES]
    if unknown:
        return _fail(f"unknown metric(s) {', '.join(unknown)}; known: {', '.join(METRIC_NAMES)}")
    try:
        texts = [t for t in args.corpus.read_text(encoding="utf-8").splitlines() if t.strip()]
    except OSError as e:
        return _fail(f"cannot read corpus {str(args.corpus)!r}: {e}")
    if not texts:
        return _fail(f"corpus {str(args.corpus)!r} holds no text")

    from tqdm.auto import tqdm

    from .interpret.analysis import analyze
    from .interpret.roles import HeadRole, strongest
    from .pretrained import load_encoder

    encoder = load_encoder(args.model)
    analysis = analyze(
        encoder, texts, progress=lambda xs: tqdm(xs, desc="texts", disable=len(xs) < 50)
    )
    metrics = analysis.metrics
    if args.importance:
        from .interpret.importance import ablation_importance

        metrics = {**metrics, "ablation": ablation_importance(encoder, texts, progress=True)}
        columns.append("ablation")
    L, H = analysis.shape
    ranked: list[tuple[int, int, HeadRole | None]] = [
        (r.layer, r.head, r) for r in strongest(analysis.roles)
    ]
    seen = {(layer, head) for layer, head, _ in ranked}
    ranked += [
        (layer, head, None) for layer in range(L) for head in range(H) if (layer, head) not in seen
    ]
    rows = []
    for layer, head, role in ranked[: args.top]:
        cells = [f"L{layer} H{head}", role.role if role else "-"]
        cells += [f"{float(metrics[c][layer, head]):.3f}" for c in columns]
        rows.append(cells)
    print(f"{args.model} over {len(texts)} texts (means; padding excluded)")
    print(format_table(["head", "role", *columns], rows, left=(0, 1)))
    return 0
