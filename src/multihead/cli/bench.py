"""`multihead bench SUITE`: run a benchmark and print its table. Each suite is a command module
of its own (bench_*.py), listed in SUBCOMMANDS; `add_common` and `apply_common` give every
suite the same --threads option."""

from __future__ import annotations

import importlib.util

from .errors import UsageError
from .parsing import positive_int

NAME = "bench"
HELP = "run a benchmark and print its table"
SUBCOMMANDS = (
    "bench_attention",
    "bench_embed",
    "bench_decode",
    "bench_encoder_layer",
    "bench_parallel",
)


def add_common(parser) -> None:
    parser.add_argument("--threads", type=positive_int, help="torch intra-op threads")


def apply_common(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)


def require(module: str, suite: str, why: str) -> None:
    """Fail before any work when a peer the suite compares against is not installed."""
    if importlib.util.find_spec(module) is None:
        raise UsageError(
            f"multihead bench {suite} compares against {why}, which is not installed: "
            f"pip install 'multihead[bench]'"
        )
