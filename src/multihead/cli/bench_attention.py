"""`multihead bench attention`: MultiHeadAttention vs torch.nn.MultiheadAttention and the
SDPA floor, interleaved in one process."""

from __future__ import annotations

import argparse
import sys

from .bench import add_common, add_device, apply_common, check_device
from .errors import UsageError
from .parsing import positive_int

NAME = "attention"
HELP = "MultiHeadAttention vs torch.nn.MultiheadAttention and the SDPA floor"
REPEATS = 7  # samples per contender
QUICK_REPEATS = 3


MASKS = (
    "window",
    "documents",
    "prefix",
    "mask_mod",
    "documents_mod",
    "general_mod",
)  # (bench.attention_structure.MASKS)


def mask_kinds(text: str) -> tuple[str, ...]:
    """--mask: 'all', or masks of MASKS separated by commas, in the order given."""
    if text == "all":
        return MASKS
    kinds = tuple(part.strip() for part in text.split(","))
    wrong = [kind for kind in kinds if kind not in MASKS]
    if wrong or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"expected one or more of {', '.join(MASKS)} separated by commas (each once), "
            f"or all; got {text!r}"
        )
    return kinds


def add_arguments(parser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="small shapes, few repeats (a smoke run, not a result)"
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        help=f"samples per contender (default {REPEATS}; {QUICK_REPEATS} with --quick)",
    )
    parser.add_argument(
        "--mask",
        metavar="KIND[,KIND...]",
        type=mask_kinds,
        help="structured attention instead: the function and the module against their ideal "
        "(the cost of the allowed pairs), dense-mask SDPA and compiled flex_attention (CPU, "
        f"fp32); one or more of {', '.join(MASKS)} (comma-separated), or all",
    )
    parser.add_argument(
        "--contend",
        action="store_true",
        help="measure beside a competing process (matrix products on every core, started and "
        "stopped by the bench): the figures of a machine shared with another busy job",
    )
    parser.add_argument(
        "--conditions",
        metavar="LIST",
        help="with --mask: measure under each of these in turn, e.g. 1,default,contend (a thread "
        "count; 'default': this process's threads; 'contend': them beside a competing process), "
        "with the small calls and the dense module, every row with its target and whether it holds",
    )
    add_device(parser)
    add_common(parser)


def run(args) -> int:
    check_device(args)
    if args.conditions is not None:
        return _run_conditions(args)
    apply_common(args)
    if not args.contend:
        return _run(args)
    from ..bench import contend

    with contend.busy_process():
        print(f"condition: {contend.describe()}, started and stopped by this bench", flush=True)
        return _run(args)


def _run_conditions(args) -> int:
    from ..bench import attention_conditions, contend

    if args.mask is None:
        raise UsageError("--conditions measures the structured table: give --mask too")
    if args.contend:
        raise UsageError("--conditions names its own: use 'contend' in it instead of --contend")
    if args.device != "cpu" or args.dtype != "fp32":
        raise UsageError(
            f"--mask measures --device cpu --dtype fp32 (the tiled backend's targets), "
            f"got --device {args.device} --dtype {args.dtype}"
        )
    try:
        conditions = attention_conditions.parse(args.conditions, contend.cores())
    except ValueError as e:
        raise UsageError(str(e)) from None
    apply_common(args)
    kinds, reps = args.mask, args.repeats or QUICK_REPEATS
    attention_conditions.run(
        kinds, conditions, quick=args.quick, repeats=reps, emit=lambda s: print(s, flush=True)
    )
    return 0


def _run(args) -> int:
    from ..bench import attention

    if args.mask is not None:
        from ..bench import attention_structure

        if args.device != "cpu" or args.dtype != "fp32":
            raise UsageError(
                f"--mask measures --device cpu --dtype fp32 (the tiled backend's targets), "
                f"got --device {args.device} --dtype {args.dtype}"
            )
        kinds, reps = args.mask, args.repeats or QUICK_REPEATS
        table = attention_structure.main(
            kinds, quick=args.quick, repeats=reps, contended=args.contend
        )
        print(table)
        return 0
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    print(attention.main(quick=args.quick, repeats=repeats, device=args.device, dtype=args.dtype))
    if args.quick:
        print(
            f"\nnote: --quick is a smoke run ({repeats} samples of tiny shapes, where a call "
            "takes microseconds): on a busy machine its ratios can be off by orders of "
            "magnitude. Quote ratios only from a full run.",
            file=sys.stdout,
        )
    return 0
