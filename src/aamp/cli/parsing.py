"""Declaring a command's arguments: the parser class of every `aamp` parser (`Parser`), a
command's actions (`aamp policy show NAME`) and their words."""

from __future__ import annotations

import argparse
import os
import sys

FALLBACK_COLUMNS = 80  # shutil.get_terminal_size's fallback


def terminal_columns() -> int:
    """The terminal's width as `shutil.get_terminal_size` gives it (COLUMNS, else the terminal
    on standard output, else 80). argparse asks shutil for it at every argument it adds, and
    shutil loads its compressors (bz2, lzma, zlib): ~3 ms of every command."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or FALLBACK_COLUMNS
    except (AttributeError, ValueError, OSError):
        return FALLBACK_COLUMNS


class HelpFormatter(argparse.HelpFormatter):
    """argparse's own, given the terminal's width rather than asking shutil for it."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24):
        # argparse's own default width: the terminal's, less 2.
        super().__init__(prog, indent_increment, max_help_position, terminal_columns() - 2)


class Parser(argparse.ArgumentParser):
    """argparse's parser with `HelpFormatter`; its subcommands' parsers are Parsers too (an
    ArgumentParser makes its subparsers of its own class)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def actions(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """The command's actions, one of which must be given (it is `args.action`)."""
    return parser.add_subparsers(dest="action", required=True)


def action(
    actions: argparse._SubParsersAction, name: str, help: str, *positionals: str
) -> argparse.ArgumentParser:
    """One action with its positional arguments, in order; options are added to what returns."""
    parser = actions.add_parser(name, help=help)
    for positional in positionals:
        parser.add_argument(positional)
    return parser
