"""`multihead train reverse`: an encoder-decoder learns to reverse sequences; the command
prints held-out accuracy and each cross-attention head's alignment, and writes summary.json
and reverse.png."""

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

NAME = "reverse"
HELP = "train an encoder-decoder to reverse sequences; measure cross-attention alignment"
DESCRIPTION = (
    "Train an encoder-decoder of multihead blocks to reverse random token sequences; report "
    "greedy-decoding accuracy on held-out sequences and, per cross-attention head, the share "
    "of attention on the aligned source token; write summary.json and reverse.png to --out."
)


def add_arguments(parser) -> None:
    add_common(parser, steps=1500, eval_every=100, out="multihead-reverse")


def run(args) -> int:
    from ..train.reverse import ReverseConfig

    config = config_of(ReverseConfig, steps=args.steps, seed=args.seed, eval_every=args.eval_every)
    out = prepare(args)
    return with_threads(args, lambda: _train(config, out, args))


def _train(config, out: Path, args) -> int:
    from ..train.plots import reverse_png
    from ..train.reverse import train_reverse
    from ..train.summary import reverse_summary, write_summary

    run = train_or_usage_error(
        lambda: train_reverse(config, progress=progress(args, "reverse"), **checkpoint_of(args))
    )
    summary = reverse_summary(run)
    write_summary(summary, out / "summary.json")
    reverse_png(run, out / "reverse.png")
    print(describe(summary))
    print(f"wrote {out / 'summary.json'}, {out / 'reverse.png'}")
    return 0


def describe(s: dict) -> str:
    c = s["config"]
    rows = [
        [f"L{h['layer']} H{h['head']}", f"{h['alignment']:.2f}"]
        for h in sorted(s["heads"], key=lambda h: -h["alignment"])
    ]
    return "\n".join(
        [
            f"reverse: encoder-decoder, {c['num_layers']}+{c['num_layers']} layers x "
            f"{c['num_heads']} heads, {c['steps']} steps, seed {c['seed']}: {s['seconds']:.0f} s "
            f"on {s['threads']} thread{'s' if s['threads'] != 1 else ''}",
            f"held-out greedy decoding: token accuracy {s['accuracy']:.3f}, whole sequences "
            f"{s['sequence_accuracy']:.3f}",
            format_table(["cross-attn head", "mass on the aligned source token"], rows),
        ]
    )
