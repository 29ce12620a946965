"""`multihead train induction`: a 2-layer model learns in-context copying; the command prints
the phase change, every head's scores and the ablation table, and writes summary.json,
induction.png and report.html."""

from __future__ import annotations

from pathlib import Path

from ..table import format_table
from .train import (
    add_common,
    checkpoint_of,
    config_of,
    prepare,
    progress,
    train_or_usage_error,
    with_threads,
)

NAME = "induction"
HELP = "train a 2-layer model on repeated random segments; watch induction heads form"
DESCRIPTION = (
    "Train a small causal model on random tokens with a repeated segment, measure every head on "
    "held-out sequences as it learns, find the phase change, ablate each head, and write "
    "summary.json, induction.png and report.html to --out."
)
POSITIONS = ("alibi", "rope", "learned")
INDUCTION_THRESHOLD = 0.3  # the induction role's threshold (interpret/roles.py; a test checks)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--positions", choices=POSITIONS, default="alibi", help="position scheme (default alibi)"
    )
    add_common(parser, steps=3000, eval_every=50, out="multihead-induction")


def run(args) -> int:
    from ..train.induction import InductionConfig

    config = config_of(
        InductionConfig,
        position=args.positions,
        steps=args.steps,
        seed=args.seed,
        eval_every=args.eval_every,
    )
    out = prepare(args)
    return with_threads(args, lambda: _train(config, out, args))


def _train(config, out: Path, args) -> int:
    from ..train.induction import train_induction
    from ..train.plots import induction_png
    from ..train.report import write_induction_report
    from ..train.summary import induction_summary, write_summary

    run = train_or_usage_error(
        lambda: train_induction(
            config, progress=progress(args, f"induction ({config.position})"), **checkpoint_of(args)
        )
    )
    summary = induction_summary(run)
    write_summary(summary, out / "summary.json")
    induction_png(run, out / "induction.png")
    write_induction_report(run, out / "report.html")
    print(describe(summary))
    print(f"wrote {out / 'summary.json'}, {out / 'induction.png'}, {out / 'report.html'}")
    return 0


def describe(s: dict) -> str:
    """What the run measured, as text: the verdict on the phase change and a table of heads."""
    c = s["config"]
    kind = "attention-only" if c["attention_only"] else "attention + MLP"
    lines = [
        f"induction: {c['position']} positions, {c['num_layers']} layers x {c['num_heads']} "
        f"heads ({kind}), {c['steps']} steps, seed {c['seed']}: {s['seconds']:.0f} s on "
        f"{s['threads']} thread{'s' if s['threads'] != 1 else ''}",
        f"loss on the repeated copy {s['loss_second_copy_at_start']:.2f} -> "
        f"{s['loss_second_copy']:.2f} nats (first copy, unpredictable: "
        f"{s['loss_first_copy']:.2f})",
    ]
    best = max(h["induction"] for h in s["heads"])
    if s["circuit_formed"] and not s["induction_head_formed"]:
        lines.append(
            f"the repeated copy is learned (steepest gain at step {s['phase_change_step']}), but "
            f"no head reaches an induction score of {INDUCTION_THRESHOLD} (best {best:.2f}): "
            "the model copies some other way"
        )
    elif s["circuit_formed"]:
        verdict = "coincides with" if s["phase_change_coincides"] else "does NOT coincide with"
        lines.append(
            f"phase change at step {s['phase_change_step']}: {verdict} the steepest rise of the "
            f"best induction score (step {s['induction_rise_step']}, tolerance "
            f"{s['phase_change_tolerance']} steps; best score now {best:.2f})"
        )
    else:
        lines.append(
            f"NO phase change: the induction circuit did not form within {c['steps']} steps "
            f"with {c['position']} positions (the repeated copy is not predicted better than "
            "half the first copy's loss); more --steps may help (learned positions: see "
            "docs/training.md)"
        )
    ablation = {(a["layer"], a["head"]): a for a in s["ablation"]}
    rows = []
    for h in s["heads"]:
        a = ablation[(h["layer"], h["head"])]
        rows.append(
            [
                f"L{h['layer']} H{h['head']}",
                f"{h['previous_token']:.2f} (i-{h['previous_token_offset']})",
                f"{h['induction']:.2f} ({h['induction_offset']:+d})",
                f"{h['duplicate']:.2f}",
                f"{a['zero']:.2f}",
                f"{a['mean']:.2f}",
            ]
        )
    headers = ["head", "prev-token", "induction", "duplicate", "zeroed", "mean-abl."]
    lines.append(format_table(headers, rows))
    lines.append(
        "prev-token: mass on key i-d (best d); induction: mass on the token `offset` after the "
        "earlier copy of the query's token (best offset); zeroed / mean-abl.: repeated-copy loss "
        f"with the head ablated (none: {s['loss_second_copy']:.2f})"
    )
    return "\n".join(lines)
