"""`multihead bench patching`: activation patching of every head at every position, one forward
per patch vs the batched engine (and attribution patching), on a SmolLM2-135M-shaped model or a
checkpoint (`--model`: a directory or .gguf file)."""

from __future__ import annotations

from .bench import add_common, apply_common
from .parsing import positive_int

NAME = "patching"
HELP = "activation patching: one forward per patch vs the batched engine"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="a decoder checkpoint directory or .gguf file (default: random weights of "
        "SmolLM2-135M's shape)",
    )
    parser.add_argument(
        "--layers", type=positive_int, help="blocks of the random model (default 30, SmolLM2's)"
    )
    parser.add_argument("--tokens", type=positive_int, default=9, help="positions (default 9)")
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="runs per engine (default 3)"
    )
    parser.add_argument(
        "--samples",
        type=positive_int,
        default=30,
        help="patches of the loop engine timed one by one (default 30)",
    )
    parser.add_argument(
        "--full-loop", action="store_true", help="run the whole loop engine instead of a sample"
    )
    parser.add_argument(
        "--attribution",
        action="store_true",
        help="instead: attribution patching (AtP, AtP+QK fix, AtP*; verify 0/10) against real "
        "patch() on the IOI and factual-recall studies (needs --model with a tokenizer; the "
        "docs use SmolLM2)",
    )
    add_common(parser)


def run(args) -> int:
    apply_common(args)
    from ..bench import patching

    if args.attribution:
        from ..bench import attribution
        from .errors import UsageError

        if args.model is None:
            raise UsageError("--attribution needs --model (a checkpoint with its tokenizer)")
        model, name = patching._model(args.model, None)
        print(attribution.run(model, name))
        return 0

    print(
        patching.run(
            model_path=args.model,
            layers=args.layers,
            tokens=args.tokens,
            repeats=args.repeats,
            samples=args.samples,
            full_loop=args.full_loop,
        )
    )
    return 0
