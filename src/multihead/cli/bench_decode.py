"""`multihead bench decode`: greedy decoding with the KV cache vs recomputation and Hugging
Face GPT-2 `generate`, on identical random weights."""

from __future__ import annotations

from .bench import add_common, apply_common, require
from .errors import UsageError
from .parsing import positive_int

NAME = "decode"
HELP = "greedy decoding with the KV cache vs recomputation and HF GPT-2 generate"
POSITIONS = 1024  # the position table of the GPT-2-small shape that bench.decode builds


def add_arguments(parser) -> None:
    parser.add_argument(
        "--batches", type=positive_int, nargs="+", default=[1, 8], help="batch sizes (default 1 8)"
    )
    parser.add_argument(
        "--new", type=positive_int, default=256, help="tokens to generate (default 256)"
    )
    parser.add_argument(
        "--prompt", type=positive_int, default=128, help="prompt length (default 128)"
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=2, help="runs per contender (default 2)"
    )
    add_common(parser)


def run(args) -> int:
    require("transformers", NAME, "Hugging Face transformers")
    if args.new < 2:
        raise UsageError(
            f"--new must be at least 2 (steps are timed after the first), got {args.new}"
        )
    if args.prompt + args.new > POSITIONS:
        raise UsageError(
            f"--prompt {args.prompt} + --new {args.new} is more than the model's {POSITIONS} "
            "positions"
        )
    apply_common(args)
    from ..bench import decode

    print(
        decode.run(batches=args.batches, prompt_len=args.prompt, new=args.new, repeats=args.repeats)
    )
    return 0
