"""`multihead bench parallel`: ring attention (per-rank peak memory and time at P = 1, 2, 4 and
growing T) and tensor-parallel heads (a CausalLM's per-rank parameter memory and training step
time at tp = 1, 2, 4). It spawns the ranks itself: gloo on CPU, NCCL with one GPU per rank when
there are enough GPUs."""

from __future__ import annotations

import argparse

from .bench import add_common
from .errors import UsageError
from .parsing import positive_int

NAME = "parallel"
HELP = "ring attention and tensor-parallel heads on 1, 2 and 4 spawned ranks"
SEQ_LENS = (1024, 2048, 4096, 8192)
QUICK_SEQ_LENS = (256, 512)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--what",
        choices=("ring", "tensor", "both"),
        default="both",
        help="ring attention, tensor-parallel heads, or both (default both)",
    )
    parser.add_argument(
        "--world-sizes",
        type=positive_int,
        nargs="+",
        default=[1, 2, 4],
        help="ranks per run (default 1 2 4)",
    )
    parser.add_argument(
        "--seq-lens",
        type=positive_int,
        nargs="+",
        help="ring: total sequence lengths (default " + " ".join(map(str, SEQ_LENS)) + ")",
    )
    parser.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag",
                        help="ring: how the sequence is split (default zigzag)")  # fmt: skip
    parser.add_argument("--backward", action="store_true",
                        help="ring: time forward + backward (default forward only)")  # fmt: skip
    parser.add_argument("--block-size", type=positive_int, default=256,
                        help="ring: queries and keys per tile (default 256)")  # fmt: skip
    parser.add_argument("--head-dim", type=positive_int, default=64,
                        help="ring: head width D (default 64)")  # fmt: skip
    parser.add_argument("--heads", type=positive_int, default=8,
                        help="query heads H, both parts (default 8)")  # fmt: skip
    parser.add_argument("--kv-heads", type=positive_int,
                        help="key/value heads Hkv, both parts (default H)")  # fmt: skip
    parser.add_argument("--dim", type=positive_int, default=256,
                        help="tensor: model width (default 256)")  # fmt: skip
    parser.add_argument("--layers", type=positive_int, default=4,
                        help="tensor: layers (default 4)")  # fmt: skip
    parser.add_argument("--seq-len", type=positive_int, default=128,
                        help="tensor: tokens per batch row (default 128)")  # fmt: skip
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed calls per point (default 5)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="small shapes, 2 repeats (a smoke run, not a result)")  # fmt: skip
    add_common(parser)


def _check(args: argparse.Namespace) -> None:
    """Every combination the runs will meet, before any process starts."""
    worlds = sorted(set(args.world_sizes))
    kv = args.kv_heads or args.heads
    if args.heads % kv:
        raise UsageError(f"--kv-heads {kv} must divide --heads {args.heads}")
    if args.what in ("ring", "both"):
        need = (2 if args.layout == "zigzag" else 1) * worlds[-1]
        short = [t for t in args.seq_lens if t < need]
        if short:
            raise UsageError(
                f"--seq-lens {short[0]} is too short: a {args.layout} layout over "
                f"{worlds[-1]} ranks needs at least {need} positions"
            )
    if args.what in ("tensor", "both"):
        if args.dim % args.heads or (args.dim // args.heads) % 2:
            raise UsageError(
                f"--dim {args.dim} must be --heads {args.heads} times an even head width (RoPE)"
            )
        from ..parallel.heads import HeadSplit

        ffn = 4 * args.dim
        for tp in worlds:
            try:
                HeadSplit.plan(args.heads, kv, args.dim // args.heads, tp, 0)
            except ValueError as err:
                raise UsageError(f"--world-sizes {tp}: {err}") from None
            if ffn % tp:
                raise UsageError(f"--world-sizes {tp} must divide the MLP width 4 x --dim = {ffn}")


def run(args) -> int:
    if args.quick:  # small shapes everywhere (explicit --seq-lens still count)
        args.seq_lens = args.seq_lens or list(QUICK_SEQ_LENS)
        args.dim, args.layers, args.seq_len, args.repeats = 64, 2, 32, 2
    args.seq_lens = args.seq_lens or list(SEQ_LENS)
    _check(args)
    from ..bench import parallel, tensor_parallel

    worlds = tuple(sorted(set(args.world_sizes)))
    threads = args.threads or 1  # per rank
    if args.what in ("ring", "both"):
        print(
            parallel.run(
                world_sizes=worlds, seq_lens=tuple(args.seq_lens), heads=args.heads,
                kv_heads=args.kv_heads, head_dim=args.head_dim, layout=args.layout,
                backward=args.backward, block_size=args.block_size, repeats=args.repeats,
                threads=threads,
            )
        )  # fmt: skip
    if args.what == "both":
        print()
    if args.what in ("tensor", "both"):
        print(
            tensor_parallel.run_tensor_parallel(
                world_sizes=worlds, dim=args.dim, layers=args.layers, heads=args.heads,
                kv_heads=args.kv_heads, seq_len=args.seq_len, repeats=args.repeats,
                threads=threads,
            )
        )  # fmt: skip
    return 0
