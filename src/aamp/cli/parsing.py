"""Declaring a command's arguments: its actions (`aamp policy show NAME`) and their words."""

from __future__ import annotations

import argparse


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
