"""`multihead bench attention-memory`: peak memory of a key mask, causal, and both at long
sequences (both together must stay O(T): no (T, T) mask)."""

from __future__ import annotations

from .bench import add_device, check_device
from .errors import UsageError
from .parsing import positive_int

NAME = "attention-memory"
HELP = "peak memory of key mask / causal / both at long sequences (O(T), no T x T mask)"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--lengths",
        type=positive_int,
        nargs="+",
        default=[8192, 32768],
        help="sequence lengths (default 8192 32768)",
    )
    parser.add_argument("--dim", type=positive_int, default=512, help="embed_dim (default 512)")
    parser.add_argument("--heads", type=positive_int, default=8, help="heads (default 8)")
    add_device(parser)


def run(args) -> int:
    if args.dim % args.heads:
        raise UsageError(f"--dim {args.dim} must be divisible by --heads {args.heads}")
    check_device(args)
    from ..bench import attention_memory

    print(
        attention_memory.run(
            args.lengths, args.dim, args.heads, device=args.device, dtype=args.dtype
        )
    )
    return 0
