"""`multihead inspect TEXT`: what every head of a model (a BERT-family encoder or a causal LM)
attends to in one text, as role tables on the terminal and a report file (HTML, PNG or JSON)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from ..table import format_table
from . import inspect_syntax
from .errors import UsageError
from .inputs import check_text_argument, lines_of, read_stdin, read_text_file
from .model_dir import DEFAULT_MODEL, ModelDir, check_model, load_subject
from .outputs import check_writable, output_format, write_atomic
from .parsing import non_negative_int, positive_int
from .progress import Progress

NAME = "inspect"
HELP = "show what every head of a model attends to in TEXT, and write a report"
DESCRIPTION = (
    "Run the model on TEXT, print the most clearly specialised heads with their measured roles "
    "(those measured on the text apart from those measured on repeated random tokens), and "
    "write a report: HTML (default), PNG or JSON, chosen by --format or the -o suffix. With a "
    "spaCy pipeline (--parser, or an installed English one), also which heads find each "
    "dependency relation of TEXT."
)
FORMATS = ("html", "png", "json")
SHOWN_TOKENS = 40  # tokens printed in the header line


def add_arguments(parser) -> None:
    parser.add_argument(
        "text", nargs="?", help="the text to inspect (quote it); '-' reads it from stdin"
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        metavar="FILE",
        help="inspect over a corpus instead (UTF-8, one text per line): each role with a 95%% "
        "bootstrap interval over the texts, given only where the interval clears its threshold",
    )
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
        "--top",
        type=positive_int,
        default=12,
        help="rows per section: one per kind of role, then the strongest other heads up to N "
        "(default 12); sinks are summarised in one line",
    )
    inspect_syntax.add_argument(parser)


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


MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w.-]+)?$")


def _read_texts(args) -> list[str]:
    """The texts to analyse: TEXT, stdin, or the lines of --corpus."""
    if args.corpus is not None:
        if args.text is not None:
            raise UsageError("give TEXT or --corpus FILE, not both")
        texts = lines_of(read_text_file(args.corpus, "--corpus"))
        if not texts:
            raise UsageError(f"--corpus {str(args.corpus)!r} holds no text (only blank lines)")
        return texts
    if args.text is None:
        raise UsageError("give TEXT to inspect (or --corpus FILE)")
    text = read_stdin() if args.text == "-" else check_text_argument(args.text, "TEXT")
    if not text.strip():
        raise UsageError("TEXT is empty; give a sentence to inspect")
    if args.text != "-" and _is_path(text):
        raise UsageError(
            f"TEXT {text!r} is a path on disk: did you mean --model {text}? (to inspect a text "
            f"that names a path, give it on stdin with '-')"
        )
    return [text]


def _is_path(text: str) -> bool:
    """TEXT names a file or directory (one line, short enough to be a path)."""
    if "\n" in text or len(text) > 1024:
        return False
    try:
        return Path(text).exists()
    except OSError:  # a name too long for the file system, or otherwise not a path
        return False


def _model_hint(args) -> str | None:
    """A note when TEXT looks like a model id ("org/name") rather than a sentence."""
    if args.corpus is None and args.text and MODEL_ID.match(args.text.strip()):
        return f"TEXT {args.text!r} looks like a model id: did you mean --model {args.text}?"
    return None


def run(args) -> int:
    texts = _read_texts(args)
    _check_focus(args, None, None)
    fmt = output_format(args.output, args.format, FORMATS, default="html")
    if args.output is None:  # the default path, in the current directory
        output = check_writable(Path(f"multihead-inspect.{fmt}"), "report (give -o PATH)")
    else:
        output = check_writable(args.output)
    if fmt == "png" and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--format png needs matplotlib: pip install 'multihead[report]'")
    pipeline = inspect_syntax.choose_pipeline(args)  # a bad --parser fails before the model loads
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

    analysis = analyze(subject, texts, max_tokens=args.max_tokens, progress=progress)
    syntax, note = inspect_syntax.compute(pipeline, subject, texts[0], args.max_tokens, analysis)
    progress.done()
    print_summary(args, analysis, L, H, subject.max_positions)
    inspect_syntax.print_section(syntax, note, args.top)

    item = analysis.texts[0]
    title = f"{args.model}: {item.text}" + ("…" if item.truncated else "")
    if len(texts) > 1:
        title = f"{args.model}: {len(texts)} texts of {args.corpus} (the first shown)"
    focus = (args.layer, args.head) if args.layer is not None else None
    progress.status(f"writing {fmt.upper()} report…")
    write_report(analysis, output, fmt, title=title, focus=focus, model=args.model, syntax=syntax)
    progress.done()
    print(f"report: {output.resolve()}")
    return 0


def write_report(
    analysis, output: Path, fmt: str, *, title: str, focus, model: str, syntax=None
) -> None:
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

        data = to_json(analysis, model=model, syntax=syntax)
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
    from ..interpret.roles import role_table, sink_summary, sinks_that_induct

    item = analysis.texts[0]
    T = len(item.tokens)
    N = len(analysis.texts)
    if N == 1:
        print(
            f"{args.model}: {analysis.kind}, {L} layers x {H} heads, {T} tokens analysed: "
            f"{_token_line(item.tokens)}"
        )
    else:
        tokens = sum(len(x.tokens) for x in analysis.texts)
        print(
            f"{args.model}: {analysis.kind}, {L} layers x {H} heads, {N} texts of "
            f"{args.corpus} ({tokens} tokens) analysed"
        )
    if analysis.causal:
        print(
            "causal: each token attends to itself and earlier tokens only; "
            f"sinks measured on {analysis.sink_label}"
        )
    hint = _model_hint(args)
    if hint:
        print(f"note: {hint}")
    for note in analysis.notes:
        more = ""
        if note.startswith("truncated") and analysis.max_tokens < model_limit:
            more = f"; --max-tokens {model_limit} analyses more"
        print(f"note: {note}{more}")
    where = f"this text ({T} tokens)" if N == 1 else f"the {N} texts"
    sections = [
        ("text", f"Roles measured on {where}"),
        ("probe", f"Roles measured on repeated random tokens ({analysis.probe})"),
    ]
    for source, heading in sections:
        if source == "probe" and analysis.probe is None:
            continue
        if source == "text" and not analysis.text_measured:
            short = "the text is" if N == 1 else "the texts are"
            print(f"\n{heading}: none, {short} too short to measure (see the note above)")
            continue
        table = role_table(analysis.roles, source)
        print(f"\n{heading}: {table.passing} of {L * H} heads pass a threshold")
        if table.sinks:
            print(f"sinks: {sink_summary(table.sinks)} on {analysis.sink_label}")
        _print_rows("one head per role, the strongest of each:", table.per_kind, N)
        room = max(0, args.top - len(table.per_kind))
        shown = table.rest[:room]
        if shown:
            left = len(table.rest) - len(shown)
            tail = f" ({left} more not shown; --top)" if left else ""
            _print_rows(f"other heads, strongest first{tail}:", shown, N)
    both = sinks_that_induct(analysis.roles)
    if both:
        heads = ", ".join(f"L{layer} H{head}" for layer, head in both)
        print(
            f"\nnote: {heads}: a sink on the text and an induction head on the probe (it rests "
            "on the sink when there is nothing to copy)"
        )
    print("\nstrength = measured value / the role's threshold (1.00x: at it); strongest first")
    if N > 1:
        over = "texts" if analysis.probe is None else "texts (probe roles: over its trials)"
        print(
            f"95% CI: bootstrap over the {over}; a role is given only where the interval's low "
            "end clears the role's threshold"
        )
    if args.layer is not None:
        roles = analysis.roles[args.layer][args.head]
        summary = "; ".join(str(r) for r in roles) if roles else "no clear role"
        print(f"L{args.layer} H{args.head}: {summary}")


def _print_rows(title: str, roles, texts: int) -> None:
    if not roles:
        return
    headers = ["head", "role", "strength", "measured"]
    if texts > 1:
        headers.insert(3, "95% CI")
    rows = []
    for r in roles:
        cells = [f"L{r.layer} H{r.head}", r.role, f"{r.strength:.2f}x", r.description]
        if texts > 1:
            cells.insert(3, f"{r.ci[0]:.2f}-{r.ci[1]:.2f}" if r.ci else "")
        rows.append(cells)
    print(title)
    print(format_table(headers, rows, left=(0, 1, len(headers) - 1)))
