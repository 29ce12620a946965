"""`multihead inspect TEXT --parser NAME`: the syntax section of `inspect` (which heads find
each dependency relation of TEXT), when a spaCy pipeline is named or an English one is
installed. The scoring lives in `interpret.syntax.one_text`; this file chooses the pipeline,
turns its failures into one error line, and prints the section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..table import format_table
from .errors import UsageError

OFF = "none"
SHOWN_HEADS = 3  # heads listed per row; the rest are counted


def add_argument(parser) -> None:
    parser.add_argument(
        "--parser",
        metavar="NAME_OR_PATH",
        help="spaCy pipeline (a package name or a directory written by nlp.to_disk) that "
        "parses TEXT to add syntax roles: which heads find each dependency relation; default: "
        "an installed English pipeline (en_core_web_sm, _md, _lg, _trf) if there is one; "
        f"'{OFF}': no syntax roles",
    )


@dataclass(frozen=True)
class Pipeline:
    """The spaCy pipeline chosen, or why there is none (`note`, printed in its place)."""

    nlp: Any = None
    name: str = ""
    note: str = ""


def choose_pipeline(args) -> Pipeline:
    """The pipeline --parser names (a UsageError if it cannot be loaded), else an installed
    English one (found without importing spaCy, so inspect starts no slower without one)."""
    from ..interpret.syntax.spacy_docs import ParserUnavailable, english_pipeline, load_parser

    if args.parser == OFF:
        return Pipeline()
    if args.corpus is not None:
        if args.parser:
            raise UsageError(
                f"--parser adds syntax roles to one TEXT, not to --corpus; for a corpus: "
                f"multihead syntax {args.corpus} --parser {args.parser}"
            )
        return Pipeline()
    name = args.parser or english_pipeline()
    if name is None:
        return Pipeline()
    try:
        return Pipeline(load_parser(name), name)
    except ParserUnavailable as e:
        if args.parser:
            raise UsageError(f"--parser {name!r}: {e}; --parser {OFF} leaves syntax out") from None
        return Pipeline(note=f"{name} is installed but could not be used ({e})")


def compute(pipeline: Pipeline, subject, text: str, max_tokens, analysis) -> tuple[Any, str]:
    """The section for `text` (its attention taken from `analysis`) or None, and a note saying
    why there is none where the user would expect one (e.g. a word no token covers)."""
    if pipeline.nlp is None:
        return None, pipeline.note
    from ..interpret.syntax.one_text import text_syntax

    try:
        section = text_syntax(
            subject,
            text,
            pipeline.nlp,
            parser=pipeline.name,
            max_tokens=max_tokens,
            attention=analysis.texts[0].attn,
        )
    except ValueError as e:
        return None, f"the text could not be scored ({e})"
    return section, ""


def _heads(row) -> str:
    if row.hits == 0:
        return "none"
    shown = ", ".join(f"L{layer} H{head}" for layer, head in row.heads[:SHOWN_HEADS])
    more = len(row.heads) - SHOWN_HEADS
    return shown + (f" (+{more} more)" if more > 0 else "")


def print_section(section, note: str, top: int) -> None:
    if section is None:
        if note:
            print(f"\nSyntax roles: none; {note}")
        return
    print(
        f"\nSyntax roles on this text (parsed by {section.parser}; one text, so counts are "
        f"small: `multihead syntax` gives corpus-level figures)"
    )
    if section.causal:
        kept, lost = section.scored_pairs, section.dropped
        print(
            "causal: "
            + ", ".join(f"{d} scores {kept[d]} of {kept[d] + lost[d]} pairs" for d in kept)
            + " (only targets before the query are visible)"
        )
    if not section.rows:
        print("no pair to score (punctuation and roots are not scored)")
        return
    rows = [
        [
            r.relation,
            r.direction,
            f"{r.hits}/{r.count}",
            _heads(r),
            f"{r.baseline_offset:+d}",
            f"{r.baseline_hits}/{r.count}",
        ]
        for r in section.rows[:top]
    ]
    headers = ["relation", "direction", "hits", "best heads", "offset", "base"]
    print(format_table(headers, rows, left=(0, 1, 3)))
    left = len(section.rows) - len(rows)
    if left:
        print(f"({left} more rows not shown; --top)")
    print(
        "hits: pairs the head links (its most-attended other word; special tokens never "
        "count);\nbest heads: those with the most hits, most attention on the targets first; "
        "base: the best\nfixed offset's hits on this text; punctuation and root not scored"
    )
