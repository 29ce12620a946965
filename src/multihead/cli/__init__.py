"""The `multihead` command: parse arguments, call the library, print or write files.

One file per command. A command module defines `NAME`, `HELP` (one line for the command list),
optionally `DESCRIPTION`, `add_arguments(parser)` and `run(args) -> int`; a group of commands
(`bench`) defines `SUBCOMMANDS`, its members' module names, instead of `run`. Adding a command
is its file plus its module name in `COMMANDS` (or in a group's `SUBCOMMANDS`).

Every user mistake raises `UsageError` before any slow work starts; `main` prints it as one
line, `multihead: error: ...`, and returns 2. Command modules import torch (and numpy) only
inside `run`, so `multihead --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from .errors import UsageError, print_error
from .parsing import Parser

COMMANDS = ("inspect", "heads", "syntax", "embed", "similarity", "bench", "train")


def _version() -> str:
    from .. import __version__

    return __version__


def _add(commands, module_name: str, depth: int = 0) -> None:
    module = importlib.import_module(f"{__name__}.{module_name}")
    parser = commands.add_parser(
        module.NAME, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP)
    )
    if hasattr(module, "add_arguments"):
        module.add_arguments(parser)
    members = getattr(module, "SUBCOMMANDS", ())
    if members:
        group = parser.add_subparsers(
            dest=f"_command{depth + 1}", metavar="COMMAND", required=True, parser_class=Parser
        )
        for member in members:
            _add(group, member, depth + 1)
    else:  # (its prog names the command in an "unrecognized arguments" error)
        parser.set_defaults(run=module.run, _prog=parser.prog)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="multihead",
        description="Multi-head attention for PyTorch: correct, fast and inspectable.",
    )
    parser.add_argument("--version", action="version", version=f"multihead {_version()}")
    commands = parser.add_subparsers(dest="_command0", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        _add(commands, name)
    return parser


def _silence_stdout() -> None:
    """After a closed pipe (`multihead embed ... | head -1`): nothing more to write."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _help_for(parser, args, extra: list[str], argv: Sequence[str]) -> str:
    """The prog whose --help covers an unrecognized argument: the command's when it comes
    after the command's name, else the top level's (`multihead --bogus train ...`)."""
    words = list(argv)
    command = getattr(args, "_command0", None)
    if command in words and extra[0] in words and words.index(extra[0]) > words.index(command):
        return getattr(args, "_prog", parser.prog)
    return parser.prog


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # (argparse would point at `multihead --help`, not the command's own)
            prog = _help_for(parser, args, extra, sys.argv[1:] if argv is None else argv)
            raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see: {prog} --help)")
        if not hasattr(args, "run"):
            parser.print_help()
            return 0
        return int(args.run(args))
    except UsageError as e:
        return print_error(e)
    except KeyboardInterrupt:
        print("multihead: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 141


__all__ = ["COMMANDS", "UsageError", "build_parser", "main"]
