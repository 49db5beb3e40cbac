"""A command that talks to the API loads only the CLI, the client, the settings and the standard
library: nothing of the server side (store, vault, audit, identity, sandbox drivers, ...), no
third-party package (SQLAlchemy, cryptography, httpx, pydantic, YAML) and no other command's
module, nor the slowest of the standard library, on its way to an answer or to an error. Each
command runs in a fresh interpreter, as a user's does, against a port where nothing listens,
so it ends on the client's error path."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aamp.cli.dispatch import COMMANDS

# The commands that act on this host itself and may load the server side, inside themselves.
LOCAL = {"up", "doctor", "model", "image", "audit", "mcp", "bundle"}  # mcp: the `mcp` package
ALLOWED_AAMP = ("aamp", "aamp.config", "aamp.cli", "aamp.client")
COMMAND_MODULES = {f"aamp.cli.{command.module}" for command in COMMANDS.values()}
# Standard-library modules too slow to load for a command's sake (each ~3-30 ms with what it
# pulls in): http.client's header parser is the e-mail package's, and it loads ssl; dataclasses
# loads inspect; argparse asks shutil for the terminal's width unless told (cli.parsing).
TOO_SLOW = ("http.client", "email", "ssl", "dataclasses", "inspect", "shutil")

COMMAND_LINES = [
    ["--help"],
    ["sandbox", "--help"],
    ["sandbox", "ls"],
    ["sandbox", "create", "--ttl", "60"],
    ["sandbox", "exec", "sb-000000000000", "--", "true"],
    ["sandbox", "rm", "sb-000000000000"],
    ["user", "ls"],
    ["user", "add", "bea", "--role", "operator"],  # makes a password here
    ["token", "ls"],
    ["token", "create", "--for", "bea", "--expires", "30d"],
    ["login", "--username", "bea", "--password-stdin"],
    ["logout", "--help"],
    ["whoami"],
    ["grant", "ls", "reporter"],
    ["policy", "ls"],
    ["host", "ls"],
    ["service", "ls"],
    ["model-endpoint", "ls"],
    ["secret", "ls"],
    ["agent", "ls"],
    ["run", "ls"],
    ["run", "reporter", "a task"],
    ["approval", "ls"],
    ["wheelhouse", "ls"],
    ["kb", "ls"],
]

# Runs one command in this interpreter and writes what it loaded, beyond the interpreter's own
# start, to the file named first.
PROBE = """
import json, sys
before = set(sys.modules)
from aamp.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code
with open(sys.argv[1], "w") as out:
    json.dump({"code": code, "loaded": sorted(set(sys.modules) - before)}, out)
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on return: nothing listens there


def not_allowed(loaded: list[str]) -> list[str]:
    def allowed(name: str) -> bool:
        top = name.split(".")[0]
        if top != "aamp":
            return top in sys.stdlib_module_names
        return any(name == a or name.startswith(a + ".") for a in ALLOWED_AAMP)

    return [name for name in loaded if not allowed(name)]


def test_every_api_command_is_checked_here() -> None:
    checked = {line[0] for line in COMMAND_LINES if not line[0].startswith("-")}
    assert checked == set(COMMANDS) - LOCAL


@pytest.mark.parametrize("words", COMMAND_LINES, ids=" ".join)
def test_an_api_command_loads_nothing_of_the_server_side(tmp_path: Path, words: list[str]):
    report = tmp_path / "loaded.json"
    env = {
        **os.environ,
        "AAMP_HOME": str(tmp_path / "home"),
        "AAMP_PORT": str(closed_port()),
        "AAMP_TOKEN": "aamp_not-a-real-token",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(report), *words],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(report.read_text())
    if words[-1] != "--help":  # it got as far as the API, and said so
        assert result["code"] == 1 and "not reachable" in done.stderr, done.stderr
    assert not_allowed(result["loaded"]) == [], done.stderr
    assert [m for m in result["loaded"] if m.split(".")[0] in TOO_SLOW or m in TOO_SLOW] == []
    # Of the commands' modules, only the typed command's own is loaded (none for `--help`).
    typed = [] if words[0] == "--help" else [f"aamp.cli.{COMMANDS[words[0]].module}"]
    assert [m for m in result["loaded"] if m in COMMAND_MODULES] == typed
