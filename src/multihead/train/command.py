"""`multihead train induction` and `multihead train reverse`: run a demo, print what it measured,
write summary.json, a PNG and (induction) the HTML report of the model's heads.

User errors raise ValueError naming the flag; the CLI layer prints them as one
`multihead: error: ...` line and exits with status 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..table import format_table
from .phase import INDUCTION_THRESHOLD


def add_commands(subparsers) -> None:
    train = subparsers.add_parser(
        "train",
        help="training demos: watch heads specialise (induction heads, cross-attention alignment)",
    )
    demos = train.add_subparsers(dest="demo", metavar="DEMO", required=True)
    ind = demos.add_parser(
        "induction",
        help="train a 2-layer model on repeated random segments; watch induction heads form",
        description="Train a small causal model on random tokens with a repeated segment, "
        "measure every head on held-out sequences as it learns, find the phase change, ablate "
        "each head, and write summary.json, induction.png and report.html to --out.",
    )
    ind.add_argument("--steps", type=int, help="optimizer steps (default 3000)")
    ind.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    ind.add_argument(
        "--positions", default="alibi", metavar="alibi|rope|learned", help="position scheme"
    )
    ind.add_argument("--eval-every", type=int, help="steps between measurements (default 50)")
    _common(ind, "multihead-induction")

    rev = demos.add_parser(
        "reverse",
        help="train an encoder-decoder to reverse sequences; measure cross-attention alignment",
        description="Train an encoder-decoder of multihead blocks to reverse random token "
        "sequences; report greedy-decoding accuracy on held-out sequences and, per "
        "cross-attention head, the share of attention on the aligned source token; write "
        "summary.json and reverse.png to --out.",
    )
    rev.add_argument("--steps", type=int, help="optimizer steps (default 1500)")
    rev.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    rev.add_argument("--eval-every", type=int, help="steps between measurements (default 100)")
    _common(rev, "multihead-reverse")


def _common(parser: argparse.ArgumentParser, out: str) -> None:
    parser.add_argument("--out", type=Path, default=Path(out), help=f"output directory ({out})")
    # One thread by default: at these sizes (64-wide, 32 tokens) a second intra-op thread buys
    # little, and on a busy machine its spin-waits made steps 20-40x slower (measured).
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _prepare(args) -> Path:
    """Check what can be checked before minutes of training: flags, matplotlib, --out."""
    if args.threads < 1:
        raise ValueError(f"--threads must be a positive integer, got {args.threads}")
    from .plots import require_matplotlib

    try:
        require_matplotlib()
    except ImportError as e:
        raise ValueError(str(e)) from None
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"--out {str(out)!r}: cannot create the directory ({e.strerror})"
        ) from None
    return out


def _progress(args, desc: str):
    if args.no_progress:
        return None
    from tqdm.auto import tqdm

    return lambda total: tqdm(total=total, desc=desc, unit="step", mininterval=0.5)


def _options(args, names: tuple[str, ...]) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def run(args) -> int:
    import torch

    from .induction import InductionConfig
    from .reverse import ReverseConfig

    # Build the config first: a bad flag fails before anything is written.
    if args.demo == "induction":
        config: InductionConfig | ReverseConfig = InductionConfig(
            position=args.positions, **_options(args, ("steps", "seed", "eval_every"))
        )
    else:
        config = ReverseConfig(**_options(args, ("steps", "seed", "eval_every")))
    out = _prepare(args)
    before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        if isinstance(config, InductionConfig):
            return _run_induction(config, out, args)
        return _run_reverse(config, out, args)
    finally:  # the caller's process (a test, a notebook) keeps its own setting
        torch.set_num_threads(before)


def _run_induction(config, out: Path, args) -> int:
    from .induction import train_induction
    from .plots import induction_png
    from .report import write_induction_report
    from .summary import induction_summary, write_summary

    run = train_induction(config, progress=_progress(args, f"induction ({config.position})"))
    summary = induction_summary(run)
    write_summary(summary, out / "summary.json")
    induction_png(run, out / "induction.png")
    write_induction_report(run, out / "report.html")
    print(_induction_text(summary))
    print(f"wrote {out / 'summary.json'}, {out / 'induction.png'}, {out / 'report.html'}")
    return 0


def _induction_text(s: dict) -> str:
    c = s["config"]
    kind = "attention-only" if c["attention_only"] else "attention + MLP"
    lines = [
        f"induction: {c['position']} positions, {c['num_layers']} layers x {c['num_heads']} "
        f"heads ({kind}), {c['steps']} steps, seed {c['seed']}: {s['seconds']:.0f} s on "
        f"{s['threads']} threads",
        f"loss on the repeated copy {s['loss_second_copy_at_start']:.2f} -> "
        f"{s['loss_second_copy']:.2f} nats (first copy, unpredictable: "
        f"{s['loss_first_copy']:.2f})",
    ]
    best = max(h["induction"] for h in s["heads"])
    if s["circuit_formed"] and not s["induction_head_formed"]:
        lines.append(
            f"the repeated copy is learned (steepest gain at step {s['phase_change_step']}), but "
            f"no head reaches an induction score of {INDUCTION_THRESHOLD} (best {best:.2f}): "
            "the model copies some other way; try more --steps"
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
        "prev-token: mass on key i-d (best d); induction: mass on the token offset after the "
        "earlier copy (best offset); zeroed / mean-abl.: repeated-copy loss without the head"
    )
    return "\n".join(lines)


def _run_reverse(config, out: Path, args) -> int:
    from .plots import reverse_png
    from .reverse import train_reverse
    from .summary import reverse_summary, write_summary

    run = train_reverse(config, progress=_progress(args, "reverse"))
    summary = reverse_summary(run)
    write_summary(summary, out / "summary.json")
    reverse_png(run, out / "reverse.png")
    c = summary["config"]
    print(
        f"reverse: encoder-decoder, {c['num_layers']}+{c['num_layers']} layers x "
        f"{c['num_heads']} heads, {c['steps']} steps, seed {c['seed']}: "
        f"{summary['seconds']:.0f} s on {summary['threads']} threads"
    )
    print(
        f"held-out greedy decoding: token accuracy {summary['accuracy']:.3f}, whole sequences "
        f"{summary['sequence_accuracy']:.3f}"
    )
    rows = [
        [f"L{h['layer']} H{h['head']}", f"{h['alignment']:.2f}"]
        for h in sorted(summary["heads"], key=lambda h: -h["alignment"])
    ]
    print(format_table(["cross-attn head", "on aligned source token"], rows))
    print(f"wrote {out / 'summary.json'}, {out / 'reverse.png'}")
    return 0
