"""`multihead heads --corpus FILE`: every head's metrics averaged over a corpus (and, with
--importance, how much the model's output changes when the head is zeroed: the sentence
embedding of an encoder, the next-token loss of a causal LM)."""

from __future__ import annotations

from pathlib import Path

from ..metric_names import METRIC_NAMES
from ..table import format_table
from .errors import UsageError
from .inputs import lines_of, read_text_file
from .model_dir import DEFAULT_MODEL, check_model, load_subject
from .parsing import positive_int
from .progress import Progress

NAME = "heads"
HELP = "head metrics (and importance) over a corpus"
DESCRIPTION = (
    "Measure every head on each text of a corpus (one text per line, each run alone, so padding "
    "never enters a metric), print the means for the most specialised heads first."
)
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


# The per-head metrics (a torch-free module: `--help` imports no torch).
METRICS = METRIC_NAMES


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", type=Path, required=True, help="UTF-8 text, one text per line")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"model directory or name (default {DEFAULT_MODEL})"
    )
    parser.add_argument(
        "--metrics",
        nargs="+",
        metavar="METRIC",
        choices=METRICS,
        help=f"metric columns, of: %(choices)s (default: {' '.join(DEFAULT_COLUMNS)})",
    )
    parser.add_argument(
        "--top", type=positive_int, default=20, help="rows, most specialised heads first"
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        metavar="N",
        help="cut each text to N tokens (default: the model's own length, 256 for MiniLM, "
        "and 256 for a causal LM)",
    )
    parser.add_argument(
        "--importance",
        action="store_true",
        help="add ablation importance: 1 - cosine between the normal and head-ablated sentence "
        "embedding (encoders), or the increase of the next-token loss (causal LMs)",
    )


def run(args) -> int:
    columns = list(args.metrics or DEFAULT_COLUMNS)
    texts = lines_of(read_text_file(args.corpus, "--corpus"))
    if not texts:
        raise UsageError(f"--corpus {str(args.corpus)!r} holds no text (only blank lines)")
    progress = Progress()
    progress.status(f"loading {args.model}…")
    model = check_model(args.model)
    model.check_length(args.max_tokens, "--max-tokens", low=3)
    subject = load_subject(model, NAME)

    from ..interpret.analysis import analyze
    from ..interpret.roles import HeadRole, strongest

    analysis = analyze(subject, texts, max_tokens=args.max_tokens, progress=progress)
    metrics = analysis.metrics
    if args.importance:
        from ..interpret.importance import ablation_importance

        importance = ablation_importance(subject, texts, progress=progress.enabled)
        metrics = {**metrics, "ablation": importance}
        columns.append("ablation")
    progress.done()
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
        name = (role.role + ("*" if role.source == "probe" else "")) if role else "-"
        ci = f"{role.ci[0]:.2f}-{role.ci[1]:.2f}" if role and role.ci else "-"
        cells = [f"L{layer} H{head}", name, ci]
        cells += [
            f"{float(metrics[c][layer, head]):.3f}" if c in metrics else "n/a" for c in columns
        ]
        rows.append(cells)
    print(f"{args.model} ({analysis.kind}) over {len(texts)} texts (means; padding excluded)")
    for note in analysis.notes:
        print(f"note: {note}")
    for name in columns:
        if name in analysis.undefined:
            print(f"{name}: n/a, {analysis.undefined[name]}")
    print(format_table(["head", "role", "95% CI", *columns], rows, left=(0, 1)))
    print(
        "role: the strongest, by measured value / threshold; * = measured on repeated random "
        "tokens (duplicate, induction), the rest on the corpus"
    )
    if len(texts) > 1:
        print(
            f"95% CI: the role's value, bootstrap over the {len(texts)} texts (* roles: over the "
            "probe's trials); a role is given only where the interval's low end clears its "
            "threshold"
        )
    else:
        print("95% CI: needs two texts or more; with one, roles are given on the value alone")
    if args.importance:
        print(f"ablation: {subject.objective.effect}")
    return 0
