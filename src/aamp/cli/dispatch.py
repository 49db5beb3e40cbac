"""`main`: the command line → the one table of commands → an exit code.

Every command is a row of `COMMANDS`: its help line, its kind, and the module of `aamp.cli`
that holds it — the function named after the command (`model-endpoint` → `model_endpoint`)
runs it, and `NAME_arguments`, where the command takes any, adds its arguments. The kinds:
- `Api` — talks to the control plane: `NAME(client, args)`, given a signed-in
  `aamp.client.Client` (closed when it returns);
- `Local` — acts on this host (`aamp.cli.local`): `NAME(args, settings)`;
- `OwnWords` — parses its own command line: `NAME(words)`, every word after its name, before
  any setting is read.

`main` turns the errors a user can act on (the API's refusals and an unreachable control
plane, bad input, files that cannot be read) into `aamp: MESSAGE` and exit 1; anything else
is a bug and keeps its traceback.

Start-up is most of a command's cost, so only what the typed command needs is loaded and built:
its module (not the other commands'), the client for an `Api` command only, and the parser of
that command alone (`parser_for`: argparse's cost is per parser, ~1 ms each, and a command's
words never reach another command's parser). `aamp --help` lists every command from the
table and loads none of their modules.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Iterable

from aamp.cli.command import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CommandError
from aamp.cli.output import shown
from aamp.cli.parsing import Parser
from aamp.config import ConfigError, Settings

Arguments = Callable[[argparse.ArgumentParser], None]
# How long an API command waits for each answer: the agent, run and approval commands longer.
API_TIMEOUT = 120.0
AGENT_API_TIMEOUT = 600.0

# The three kinds of command are plain classes: a frozen dataclass costs a millisecond or more
# to define, and that is paid at every start.


class Api:
    """Talks to the control plane: `NAME(client, args)`, with a client signed in for it.
    Its `local` actions act on this machine instead: `NAME_local(args, settings)`."""

    def __init__(
        self, help: str, module: str, timeout: float = API_TIMEOUT, local: tuple[str, ...] = ()
    ):
        self.help, self.module, self.timeout, self.local = help, module, timeout, local


class Local:
    """Acts on this host: `NAME(args, settings)`."""

    def __init__(self, help: str, module: str = "local"):
        self.help, self.module = help, module


class OwnWords:
    """Parses its own command line: `NAME(words)`, every word after the command's name."""

    def __init__(self, help: str, module: str = "local"):
        self.help, self.module = help, module


Command = Api | Local | OwnWords

COMMANDS: dict[str, Command] = {
    "up": Local("run the control plane (API on AAMP_HOST:AAMP_PORT); --role api: no own host"),
    "doctor": Local("say which isolation drivers work on this host and why not"),
    "model": OwnWords("the optional local model: model serve [--port N] | model path"),
    "image": Local("guest images"),
    "login": Local("sign in with a password; the API token goes into a login profile", "login"),
    "logout": Local("sign out: revoke the login profile's token and forget it", "login"),
    "whoami": Api("who the CLI acts as, and where", "login"),
    "mcp": Local("the MCP server over stdio, acting with the CLI's token", "mcp"),
    "bundle": OwnWords(
        "offline bundles: bundle create OUT [--sign KEY] [--wheelhouse FILE]"
        " | bundle verify PATH [--trust PUB]"
    ),
    "sandbox": Api("sandboxes", "sandbox"),
    "host": Api("sandbox hosts (admins); `host serve` runs one here", "hosts", local=("serve",)),
    "user": Api("users", "identity"),
    "token": Api("API tokens", "identity"),
    "grant": Api("per-agent grants", "identity"),
    "policy": Api("policies", "catalog"),
    "service": Api("services", "catalog"),
    "model-endpoint": Api("model endpoints (OpenAI-compatible servers agents may use)", "catalog"),
    "secret": Api("secrets (values are write-only)", "identity"),
    "wheelhouse": Api(
        "the offline wheelhouse behind policies' packages: add|ls|rm", "wheelhouse", 1800.0
    ),
    "kb": Api(
        "knowledge bases (documents indexed in sandboxes): create|add|rm-doc|ls|show|rm",
        "kb",
        1800.0,
    ),
    "audit": Local("the audit log (local)"),
    "agent": Api("agents", "agents", AGENT_API_TIMEOUT),
    "run": Api(
        "run an agent on a task (aamp run AGENT TASK), or: run ls|show|cancel|artifacts",
        "runs",
        AGENT_API_TIMEOUT,
    ),
    "approval": Api(
        "questions runs put to people (egress ask, outbound data)", "agents", AGENT_API_TIMEOUT
    ),
}


def functions(name: str) -> tuple[Callable[..., int], Arguments | None]:
    """The command's function and the one adding its arguments (None: it takes none)."""
    module = importlib.import_module(f"aamp.cli.{COMMANDS[name].module}")
    attribute = name.replace("-", "_")
    return getattr(module, attribute), getattr(module, f"{attribute}_arguments", None)


def build_parser(
    arguments_of: Iterable[str] = COMMANDS, listed: Iterable[str] = COMMANDS
) -> argparse.ArgumentParser:
    """The parser of the commands `listed` (by default all), with the arguments of those
    named in `arguments_of` (by default all)."""
    listed = list(listed)
    p = Parser(prog="aamp", description="aamp control plane")
    # Usage lines name every command even when only some are listed: they read as they would.
    every = "{" + ",".join(COMMANDS) + "}" if listed != list(COMMANDS) else None
    sub = p.add_subparsers(dest="command", required=True, metavar=every)
    for name in listed:
        command = COMMANDS[name]
        if isinstance(command, OwnWords):  # listed for --help; its words are its own
            sub.add_parser(name, help=command.help, add_help=False)
            continue
        parser = sub.add_parser(name, help=command.help)
        arguments = functions(name)[1] if name in arguments_of else None
        if arguments is not None:
            arguments(parser)
    return p


def parser_for(words: list[str]) -> argparse.ArgumentParser:
    """The parser for a command line: that of the command typed first, alone and with its
    arguments (argparse's cost is per parser, and a command's words never reach another
    command's parser); for anything else (`--help`, no command, one that does not exist)
    every command's, with the arguments of the first word that is not an option."""
    if words and words[0] in COMMANDS:
        return build_parser(arguments_of=words[:1], listed=words[:1])
    typed = next((w for w in words if not w.startswith("-")), None)
    return build_parser(arguments_of=[typed] if typed else [])


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and isinstance(COMMANDS.get(words[0]), OwnWords):
        return functions(words[0])[0](words[1:])
    after_dashes: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, after_dashes = words[:cut], words[cut + 1 :]
    args = parser_for(words).parse_args(words)
    args.after_dashes = after_dashes  # the command `aamp sandbox exec` runs; others ignore it
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"aamp: {shown(exc)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run(args.command, args, settings)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (CommandError, ValueError, OSError) as exc:
        print(f"aamp: {shown(getattr(exc, 'message', exc))}", file=sys.stderr)
        return EXIT_ERROR


def _run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    command, run = COMMANDS[name], functions(name)[0]
    if isinstance(command, Local):
        return run(args, settings)
    assert isinstance(command, Api)  # OwnWords commands returned before any parsing
    if getattr(args, "action", None) in command.local:
        module = importlib.import_module(f"aamp.cli.{command.module}")
        return getattr(module, f"{name.replace('-', '_')}_local")(args, settings)
    from aamp.client import Client, ClientError

    try:
        with Client.from_settings(settings, timeout=command.timeout) as client:
            return run(client, args)
    except ClientError as exc:
        raise CommandError(exc.message) from None
