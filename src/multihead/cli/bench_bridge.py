"""`multihead bench bridge`: a transformers model through multihead's attention (the bridge,
hooks off) vs the same model on transformers' sdpa attention, side by side."""

from __future__ import annotations

from .bench import add_common, add_device, apply_common, check_device, require
from .errors import UsageError
from .parsing import positive_int

NAME = "bridge"
HELP = "the bridge's forward vs transformers' sdpa forward on the same model"
ARCHS = ("llama", "qwen2", "mistral", "phi3", "gpt_neox", "starcoder2")


def add_arguments(parser) -> None:
    parser.add_argument(
        "--arch",
        action="append",
        choices=ARCHS,
        help="architecture (repeat for several; default llama and gpt_neox)",
    )
    parser.add_argument("--dim", type=positive_int, default=256, help="hidden size (default 256)")
    parser.add_argument("--layers", type=positive_int, default=4, help="layers (default 4)")
    parser.add_argument("--heads", type=positive_int, default=8, help="heads (default 8)")
    parser.add_argument("--tokens", type=positive_int, default=256, help="T (default 256)")
    parser.add_argument("--batch", type=positive_int, default=1, help="B (default 1)")
    parser.add_argument("--repeats", type=positive_int, default=9, help="rounds (default 9)")
    add_device(parser)
    add_common(parser)


def run(args) -> int:
    require("transformers", "bridge", "transformers' own sdpa attention")
    if args.dim % args.heads:
        raise UsageError(f"--dim {args.dim} must be a multiple of --heads {args.heads}")
    check_device(args)
    apply_common(args)
    from ..bench import bridge

    archs = tuple(args.arch) if args.arch else bridge.DEFAULT
    print(
        bridge.run(
            archs,
            dim=args.dim,
            layers=args.layers,
            heads=args.heads,
            tokens=args.tokens,
            batch=args.batch,
            repeats=args.repeats,
            device=args.device,
            dtype=args.dtype,
        )
    )
    return 0
