"""`multihead bench SUITE`: run a benchmark and print its table. Each suite is a command module
of its own (bench_*.py), listed in SUBCOMMANDS; `add_common` and `apply_common` give every
suite the same --threads option, and `add_device` / `check_device` the --device and --dtype
options of the suites that run on a GPU."""

from __future__ import annotations

import importlib.util

from .errors import UsageError
from .parsing import thread_count

NAME = "bench"
HELP = "run a benchmark and print its table"
SUBCOMMANDS = (
    "bench_attention",
    "bench_attention_memory",
    "bench_embed",
    "bench_decode",
    "bench_encoder_layer",
    "bench_parallel",
    "bench_load",
    "bench_patching",
    "bench_bridge",
)


def add_common(parser) -> None:
    parser.add_argument(
        "--threads", type=thread_count, help="torch intra-op threads (1 .. the CPUs here)"
    )


DTYPES = ("fp32", "bf16", "fp16")


def add_device(parser) -> None:
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu or cuda[:N] (on CUDA, timed with CUDA events; default cpu)",
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, default="fp32", help="weights and inputs (default fp32)"
    )


def check_device(args) -> None:
    """--device names a device this machine has (before any work)."""
    import torch

    try:
        device = torch.device(args.device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device must be cpu or cuda[:N], got {args.device!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(
                f"--device {args.device}: this machine has {torch.cuda.device_count()} CUDA "
                "device(s)"
            )


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
