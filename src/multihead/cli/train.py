"""`multihead train DEMO`: training demos that watch heads specialise. Each demo is a command
module of its own (train_*.py), listed in SUBCOMMANDS; `add_common` and `prepare` give them the
same --out, --threads and --no-progress, checked before any training starts."""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import UsageError
from .parsing import non_negative_int, positive_int, thread_count

NAME = "train"
HELP = "training demos: watch heads specialise (induction heads, cross-attention alignment)"
SUBCOMMANDS = ("train_induction", "train_reverse")
CHECKPOINT = "checkpoint.pt"  # multihead.train.checkpoints.CHECKPOINT_NAME (kept torch-free here)


def add_common(parser: argparse.ArgumentParser, *, steps: int, eval_every: int, out: str) -> None:
    parser.add_argument(
        "--steps", type=positive_int, default=steps, help=f"optimizer steps (default {steps})"
    )
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="seed of weights and data (default 0)"
    )
    parser.add_argument(
        "--eval-every",
        type=positive_int,
        default=eval_every,
        metavar="N",
        help=f"steps between measurements on held-out data (default {eval_every})",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(out), help=f"output directory (default ./{out})"
    )
    # One thread by default: at these sizes (64 wide, 12-32 tokens) a second intra-op thread
    # buys little, and on a busy machine its spin-waits made steps 20-40x slower (measured).
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=1,
        help="torch intra-op threads (default 1; at most the CPUs here)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue a killed run from --out's checkpoint.pt (written after each measurement); "
        "the result equals an uninterrupted run's",
    )
    parser.add_argument(
        "--extend",
        action="store_true",
        help="with --resume: train a finished (or stopped) run on to a larger --steps",
    )


def prepare(args) -> Path:
    """Check what can be checked before minutes of training: matplotlib, --out."""
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("the demos draw figures with matplotlib: pip install 'multihead[report]'")
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"--out {str(out)!r}: cannot create the directory ({e.strerror})"
        ) from None
    try:  # writable? tried for real (permission bits say little to root or on odd filesystems)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".multihead-", delete=True):
            pass
    except OSError as e:
        raise UsageError(f"--out {str(out)!r}: cannot write there ({e.strerror})") from None
    if args.extend and not args.resume:
        raise UsageError("--extend continues a run from its checkpoint: give --resume too")
    if args.resume and not (out / CHECKPOINT).is_file():
        raise UsageError(f"--resume: --out {str(out)!r} holds no {CHECKPOINT} to resume from")
    return out


def checkpoint_of(args) -> dict:
    """The training functions' checkpoint arguments for --out and --resume."""
    return {"checkpoint": args.out / CHECKPOINT, "resume": args.resume, "extend": args.extend}


def train_or_usage_error(train: Callable[[], object]):
    """A training run; a checkpoint it cannot resume from becomes a usage error."""
    try:
        return train()
    except ValueError as e:
        if str(e).startswith("--resume"):
            raise UsageError(str(e)) from None
        raise


def config_of(make: Callable[..., object], **fields: object):
    """The demo's config from the flags; its own checks become usage errors."""
    try:
        return make(**fields)
    except ValueError as e:
        raise UsageError(str(e)) from None


def progress(args, desc: str):
    """A tqdm bar factory for the training loop (None with --no-progress)."""
    if args.no_progress:
        return None
    from tqdm.auto import tqdm

    return lambda total: tqdm(total=total, desc=desc, unit="step", mininterval=0.5)


def with_threads(args, work: Callable[[], int]) -> int:
    """Run `work` with --threads intra-op threads, then give the caller its own setting back."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return work()
    finally:
        torch.set_num_threads(before)
