"""`multihead bench encoder-layer`: torch encoder layers converted by `replace_attention` vs
torch's fused eval fast path, interleaved in one process."""

from __future__ import annotations

from .bench import add_common, apply_common
from .parsing import positive_int

NAME = "encoder-layer"
HELP = "converted torch encoder layers/encoders vs torch's fused eval path"
REPEATS = 9


def add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="one small shape, 3 rounds")
    parser.add_argument(
        "--repeats", type=positive_int, default=REPEATS, help=f"rounds (default {REPEATS})"
    )
    add_common(parser)


def run(args) -> int:
    apply_common(args)
    from ..bench import encoder_layer

    print(encoder_layer.report(quick=args.quick, repeats=args.repeats))
    return 0
