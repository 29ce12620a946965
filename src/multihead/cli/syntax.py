"""`multihead syntax [CORPUS]`: how well every head finds each dependency relation of an
annotated corpus, against the best fixed-offset baseline, with bootstrap intervals (Clark et
al. 2019); a Clark-style table on the terminal, JSON or HTML with -o."""

from __future__ import annotations

import json
from pathlib import Path

from ..table import format_table
from .errors import UsageError
from .inputs import lines_of, read_text_file
from .model_dir import DEFAULT_MODEL, check_model, load_subject
from .outputs import check_writable, output_format, write_atomic
from .parsing import positive_int
from .progress import Progress

NAME = "syntax"
HELP = "score every head on dependency relations of a corpus (Clark et al. 2019)"
DESCRIPTION = (
    "Score every head on every dependency relation of CORPUS (CoNLL-U; or plain text, one "
    "sentence per line, parsed by the spaCy pipeline --parser NAME): for each relation and "
    "direction the best head, its accuracy with a bootstrap 95% interval over sentences, and "
    "the best fixed-offset baseline; strongest margin over the baseline first. Without CORPUS, "
    "the English corpus that ships with multihead (290 sentences, CC0)."
)
FORMATS = ("json", "html")


def add_arguments(parser) -> None:
    parser.add_argument(
        "corpus",
        nargs="?",
        type=Path,
        help="CoNLL-U file, or text with --parser (default: shipped)",
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"model directory or name (default {DEFAULT_MODEL})"
    )
    parser.add_argument(
        "--parser",
        metavar="NAME_OR_PATH",
        help="spaCy pipeline that parses a plain-text CORPUS (a package name or a directory "
        "written by nlp.to_disk)",
    )
    parser.add_argument(
        "--relations",
        nargs="+",
        metavar="REL",
        help="score only these labels (exact, e.g. det obj)",
    )
    parser.add_argument(
        "--min-count",
        type=positive_int,
        default=10,
        metavar="N",
        help="leave out relations with fewer than N scored pairs (default 10)",
    )
    parser.add_argument(
        "--show",
        metavar="REL",
        help="HTML: the relation whose arcs are drawn (default: the top row)",
    )
    parser.add_argument("-o", "--output", type=Path, help="write JSON or HTML (by the suffix)")


def read_sentences(args):
    """The corpus as Sentences (CoNLL-U, or text parsed by --parser); UsageError otherwise."""
    from ..interpret.syntax import CorpusError, parse_conllu, shipped_corpus
    from ..interpret.syntax.spacy_docs import ParserUnavailable, parse_texts

    if args.corpus is None:
        if args.parser:
            raise UsageError("--parser parses a plain-text CORPUS: give the file")
        path = shipped_corpus()
        text = path.read_text(encoding="utf-8")
    else:
        path = args.corpus
        text = read_text_file(path, "CORPUS")
    if args.parser:
        lines = lines_of(text)
        if not lines:
            raise UsageError(f"CORPUS {str(path)!r} holds no text")
        try:
            return parse_texts(lines, args.parser)
        except ParserUnavailable as e:
            raise UsageError(f"--parser {args.parser!r}: {e}") from None
        except CorpusError as e:
            raise UsageError(str(e)) from None
    if not any("\t" in line for line in text.splitlines() if not line.startswith("#")):
        raise UsageError(
            f"CORPUS {str(path)!r} holds no CoNLL-U token lines; for plain text give "
            f"--parser NAME (a spaCy pipeline, e.g. en_core_web_sm)"
        )
    try:
        return parse_conllu(text, str(path))
    except CorpusError as e:
        raise UsageError(str(e)) from None


def run(args) -> int:
    fmt = output_format(args.output, None, FORMATS, default="json") if args.output else None
    if args.output is not None:
        check_writable(args.output)
    sentences = read_sentences(args)
    if not sentences:
        raise UsageError("the corpus holds no sentences")
    if args.relations:
        from ..interpret.syntax import check_relations

        try:
            check_relations(args.relations, [r for s in sentences for r in s.relations])
        except ValueError as e:
            raise UsageError(f"--relations: {e}") from None
    progress = Progress()
    progress.status(f"loading {args.model}…")
    subject = load_subject(check_model(args.model), NAME)
    from ..interpret.syntax import syntax_scores

    try:
        result = syntax_scores(
            subject,
            sentences,
            name=args.model,
            min_count=args.min_count,
            relations=args.relations,
            progress=progress,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    progress.done()
    print_table(result, args.min_count)
    if args.output is not None:
        write_output(result, args.output, fmt, args.show)
        print(f"written: {args.output.resolve()}")
    return 0


def print_table(result, min_count: int) -> None:
    L, H = result.shape
    print(
        f"{result.model}: {L} layers x {H} heads, {len(result.sentences)} sentences, "
        f"{result.words} words"
    )
    for reason, names in result.skipped.items():
        more = ", …" if len(names) > 5 else ""
        n = len(names)
        print(f"skipped {n} sentence{'s' * (n != 1)}: {reason} ({', '.join(names[:5])}{more})")
    if result.causal:
        for direction, lost in result.dropped.items():
            kept = result.scored_pairs.get(direction, 0)
            print(
                f"causal: {direction} scores {kept} of {kept + lost} arcs (only targets before "
                f"the query are visible)"
            )
    if not result.rows:
        print(f"no relation has {min_count} scored pairs (--min-count)")
        return
    rows = [
        [
            r.relation,
            r.direction,
            str(r.count),
            f"L{r.layer} H{r.head}",
            f"{r.accuracy:.2f}",
            f"{r.ci[0]:.2f}-{r.ci[1]:.2f}",
            f"{r.baseline_offset:+d}",
            f"{r.baseline_accuracy:.2f}",
            f"{r.margin:+.2f}",
        ]
        for r in result.rows
    ]
    headers = [
        "relation",
        "direction",
        "pairs",
        "best",
        "acc",
        "95% CI",
        "offset",
        "base",
        "margin",
    ]
    print(format_table(headers, rows, left=(0, 1, 3)))
    print(
        "acc: the best head's accuracy, by the most-attended other word (Clark et al. 2019; "
        "95% CI: bootstrap over sentences);\nbase: the best fixed offset's accuracy; "
        "punctuation and root not scored"
    )


def write_output(result, output: Path, fmt: str | None, show: str | None) -> None:
    if fmt == "html":
        from ..interpret.syntax.report import html_page

        try:
            page = html_page(result, show)
        except ValueError as e:
            raise UsageError(str(e)) from None
        write_atomic(output, lambda f: f.write(page.encode("utf-8")))
    else:
        data = json.dumps(result.to_json(), indent=1)
        write_atomic(output, lambda f: f.write(data.encode("utf-8")))
