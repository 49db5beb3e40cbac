"""The command table: every row names functions that exist, and `--help` lists every command."""

from __future__ import annotations

import pytest

from aamp.cli.dispatch import COMMANDS, build_parser, functions, main

TAKE_NO_ARGUMENTS = {"up", "doctor", "model", "whoami", "mcp", "bundle"}


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
