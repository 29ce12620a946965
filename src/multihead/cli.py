"""The `multihead` command: parse arguments, call the library, print or write files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__, cli_embed, cli_inspect
from .train import command as train_command


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multihead",
        description="Multi-head attention for PyTorch: correct, fast and inspectable.",
    )
    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    bench = commands.add_parser("bench", help="run a benchmark and print its table")
    suites = bench.add_subparsers(dest="suite", metavar="SUITE", required=True)
    att = suites.add_parser(
        "attention",
        help="MultiHeadAttention vs torch.nn.MultiheadAttention and the SDPA floor",
    )
    att.add_argument("--quick", action="store_true", help="small shapes, few repeats (a smoke run)")
    att.add_argument("--repeats", type=_positive_int, help="samples per contender (default 9)")
    att.add_argument("--threads", type=_positive_int, help="torch intra-op threads")
    emb = suites.add_parser(
        "embed", help="sentence embeddings: multihead vs sentence-transformers, same model"
    )
    emb.add_argument("--model", default="all-MiniLM-L6-v2", help="model name or directory")
    emb.add_argument("--sentences", type=_positive_int, default=2000, help="corpus size")
    emb.add_argument(
        "--batch-size", type=_positive_int, default=32, help="encode's batch_size, both encoders"
    )
    emb.add_argument("--repeats", type=_positive_int, default=3, help="runs per encoder")
    emb.add_argument("--threads", type=_positive_int, help="torch intra-op threads")

    dec = suites.add_parser(
        "decode", help="greedy decoding with the KV cache vs recomputation and HF GPT-2 generate"
    )
    dec.add_argument("--batches", type=_positive_int, nargs="+", default=[1, 8])
    dec.add_argument("--new", type=_positive_int, default=256, help="tokens to generate")
    dec.add_argument("--prompt", type=_positive_int, default=128, help="prompt length")
    dec.add_argument("--repeats", type=_positive_int, default=2, help="runs per contender")
    dec.add_argument("--threads", type=_positive_int, help="torch intra-op threads")

    cli_inspect.add_commands(commands)
    cli_embed.add_commands(commands)
    train_command.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "bench":
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        if args.suite == "attention":
            from .bench import attention as suite

            print(suite.main(quick=args.quick, repeats=args.repeats))
        elif args.suite == "decode":
            from .bench import decode

            print(
                decode.run(
                    batches=args.batches, prompt_len=args.prompt, new=args.new, repeats=args.repeats
                )
            )
        elif args.suite == "embed":
            from .bench import embed

            print(
                embed.run(
                    args.model, n=args.sentences, batch_size=args.batch_size, repeats=args.repeats
                )
            )
        return 0
    if args.command == "inspect":
        return cli_inspect.run_inspect(args)
    if args.command == "heads":
        return cli_inspect.run_heads(args)
    if args.command == "embed":
        return cli_embed.run_embed(args)
    if args.command == "similarity":
        return cli_embed.run_similarity(args)
    if args.command == "train":
        try:
            return train_command.run(args)
        except ValueError as e:
            print(f"multihead: error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
