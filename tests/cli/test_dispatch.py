"""The command table: every row names functions that exist, `--help` lists every command, and a
typed command's parser, built alone, reads as the whole table's does."""

from __future__ import annotations

import argparse

import pytest

from aamp.cli.dispatch import COMMANDS, build_parser, functions, main, parser_for

TAKE_NO_ARGUMENTS = {"doctor", "model", "whoami", "mcp", "bundle"}


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_has_its_function_and_its_arguments(name: str) -> None:
    run, arguments = functions(name)
    assert callable(run) and run.__name__ == name.replace("-", "_")
    assert (arguments is None) == (name in TAKE_NO_ARGUMENTS), name


def test_the_help_lists_every_command_in_the_tables_order(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    listed = [
        line.split()[0]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("    ") and not line.startswith("     ")
    ]
    assert listed == list(COMMANDS)


def test_the_whole_parser_parses_any_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["grant", "rm", "reporter", "7"]).grant_id == 7
    assert parser.parse_args(["image", "prune", "--dry-run"]).dry_run


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


@pytest.mark.parametrize("name", [n for n in COMMANDS if n not in ("model", "bundle")])
def test_a_typed_command_builds_its_own_parser_alone_and_reads_the_same(name: str) -> None:
    alone = parser_for([name, "--help"])
    assert list(_subcommands(alone)) == [name]  # argparse's cost is per parser
    whole = build_parser()
    assert alone.format_usage() == whole.format_usage()  # a usage error names every command
    assert _subcommands(alone)[name].format_help() == _subcommands(whole)[name].format_help()


def test_no_command_or_an_unknown_one_gets_every_commands_parser() -> None:
    for words in ([], ["--help"], ["nope"], ["-h", "sandbox"]):
        assert list(_subcommands(parser_for(words))) == list(COMMANDS)
