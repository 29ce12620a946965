"""`multihead inspect TEXT`: what every head of a model (a BERT-family encoder or a causal LM)
attends to in one text, as role tables on the terminal and a report file (HTML, PNG or JSON)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..table import format_table
from .errors import UsageError
from .inputs import check_text_argument, read_stdin
from .model_dir import DEFAULT_MODEL, ModelDir, check_model, load_subject
from .outputs import check_writable, output_format, write_atomic
from .parsing import non_negative_int, positive_int
from .progress import Progress

NAME = "inspect"
HELP = "show what every head of a model attends to in TEXT, and write a report"
DESCRIPTION = (
    "Run the model on TEXT, print the most clearly specialised heads with their measured roles "
    "(those measured on the text apart from those measured on repeated random tokens), and "
    "write a report: HTML (default), PNG or JSON, chosen by --format or the -o suffix."
)
FORMATS = ("html", "png", "json")
SHOWN_TOKENS = 40  # tokens printed in the header line


def add_arguments(parser) -> None:
    parser.add_argument("text", help="the text to inspect (quote it); '-' reads it from stdin")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"model directory or name (default {DEFAULT_MODEL})"
    )
    parser.add_argument("--layer", type=non_negative_int, help="focus one head: its layer")
    parser.add_argument("--head", type=non_negative_int, help="focus one head: its index")
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        metavar="N",
        help="analyse up to N tokens (default: the model's own length, 256 for MiniLM, and 256 "
        "for a causal LM; at most its position table, 512 for MiniLM, 1024 for GPT-2); longer "
        "texts are cut and the report says so",
    )
    parser.add_argument(
        "--format", choices=FORMATS, help="report format (default: from the -o suffix, else html)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, help="report file (default ./multihead-inspect.FORMAT)"
    )
    parser.add_argument(
        "--top", type=positive_int, default=12, help="rows per table section (default 12)"
    )


def load_for_inspection(model: ModelDir):
    """The model `inspect` analyses, as an inspectable subject (`interpret.subject`): a
    BERT-family encoder or a causal LM; other architectures are refused by their config.json
    model_type."""
    return load_subject(model, NAME)


def _check_focus(args, layers: int | None, heads: int | None) -> None:
    if (args.layer is None) != (args.head is None):
        raise UsageError("--layer and --head go together: give both to focus one head")
    if args.layer is None or layers is None or heads is None:
        return
    if args.layer >= layers or args.head >= heads:
        raise UsageError(
            f"--layer {args.layer} --head {args.head} is out of range: this model has layers "
            f"0..{layers - 1}, heads 0..{heads - 1}"
        )


def _read_text(args) -> str:
    text = read_stdin() if args.text == "-" else check_text_argument(args.text, "TEXT")
    if not text.strip():
        raise UsageError("TEXT is empty; give a sentence to inspect")
    return text


def run(args) -> int:
    text = _read_text(args)
    _check_focus(args, None, None)
    fmt = output_format(args.output, args.format, FORMATS, default="html")
    if args.output is None:  # the default path, in the current directory
        output = check_writable(Path(f"multihead-inspect.{fmt}"), "report (give -o PATH)")
    else:
        output = check_writable(args.output)
    if fmt == "png" and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--format png needs matplotlib: pip install 'multihead[report]'")
    progress = Progress()
    progress.status(f"checking {args.model}…")
    model = check_model(args.model)
    _check_focus(args, model.layers, model.heads)
    model.check_length(args.max_tokens, "--max-tokens", low=3)
    progress.status(f"loading {args.model}…")
    subject = load_for_inspection(model)
    L, H = subject.num_layers, subject.num_heads
    _check_focus(args, L, H)

    from ..interpret.analysis import analyze

    analysis = analyze(subject, [text], max_tokens=args.max_tokens, progress=progress)
    progress.done()
    print_summary(args, analysis, L, H, subject.max_positions)

    item = analysis.texts[0]
    title = f"{args.model}: {item.text}" + ("…" if item.truncated else "")
    focus = (args.layer, args.head) if args.layer is not None else None
    progress.status(f"writing {fmt.upper()} report…")
    write_report(analysis, output, fmt, title=title, focus=focus, model=args.model)
    progress.done()
    print(f"report: {output.resolve()}")
    return 0


def write_report(analysis, output: Path, fmt: str, *, title: str, focus, model: str) -> None:
    if fmt == "html":
        from ..interpret.report_html import HTMLReport

        page = HTMLReport(analysis, title=title, open_head=focus).page()
        write_atomic(output, lambda f: f.write(page.encode("utf-8")))
    elif fmt == "png":
        from ..interpret import report_png

        if focus:
            layer, head = focus
            write_atomic(output, lambda f: report_png.head_png(analysis, layer, head, f))
        else:
            write_atomic(output, lambda f: report_png.grid_png(analysis, f, title=title))
    else:
        from ..interpret.report_json import to_json

        data = to_json(analysis, model=model)
        write_atomic(output, lambda f: f.write(data.encode("utf-8")))


def _token_line(tokens: list[str]) -> str:
    """Tokens joined by spaces, or by "|" when tokens carry their own spaces (byte-level)."""
    sep = "|" if any(t != t.strip() for t in tokens) else " "
    shown = [t.replace("\n", "\\n") for t in tokens]
    if len(shown) <= SHOWN_TOKENS:
        return sep.join(shown)
    head, tail = shown[: SHOWN_TOKENS - 5], shown[-5:]
    return f"{sep.join(head)} … {sep.join(tail)}"


def print_summary(args, analysis, L: int, H: int, model_limit: int) -> None:
    from ..interpret.roles import strongest

    item = analysis.texts[0]
    T = len(item.tokens)
    print(
        f"{args.model}: {analysis.kind}, {L} layers x {H} heads, {T} tokens analysed: "
        f"{_token_line(item.tokens)}"
    )
    if analysis.causal:
        print(
            "causal: each token attends to itself and earlier tokens only; "
            f"sinks measured on {analysis.sink_label}"
        )
    for note in analysis.notes:
        hint = ""
        if note.startswith("truncated") and analysis.max_tokens < model_limit:
            hint = f"; --max-tokens {model_limit} analyses more"
        print(f"note: {note}{hint}")
    sections = [
        ("text", f"Roles measured on this text ({T} tokens)"),
        ("probe", f"Roles measured on repeated random tokens ({analysis.probe})"),
    ]
    for source, heading in sections:
        if source == "probe" and analysis.probe is None:
            continue
        if source == "text" and not analysis.text_measured:
            print(f"\n{heading}: none, the text is too short to measure (see the note above)")
            continue
        best = strongest(analysis.roles, args.top, source=source)
        passing = len(strongest(analysis.roles, source=source))
        shown = f", the {len(best)} strongest shown" if passing > len(best) else ""
        print(f"\n{heading}: {passing} of {L * H} heads pass a threshold{shown}")
        if best:
            rows = [
                [f"L{r.layer} H{r.head}", r.role, f"{r.strength:.2f}x", r.description] for r in best
            ]
            print(format_table(["head", "role", "strength", "measured"], rows, left=(0, 1, 3)))
    print("\nstrength = measured value / the role's threshold (1.00x: at it); strongest first")
    if args.layer is not None:
        roles = analysis.roles[args.layer][args.head]
        summary = "; ".join(str(r) for r in roles) if roles else "no clear role"
        print(f"L{args.layer} H{args.head}: {summary}")
