"""`main`: the command line → the one table of commands → an exit code.

Every command is a row of `COMMANDS`, of one of three kinds:
- `Api` — talks to the control plane: it is given a signed-in `aamp.client.Client` (closed
  when it returns) and its parsed arguments;
- `Local` — acts on this host (`aamp.cli.local`): given its arguments and the settings;
- `OwnWords` — parses its own command line: given every word after its name, before any
  setting is read.

`main` turns the errors a user can act on (the API's refusals and an unreachable control
plane, bad input, files that cannot be read) into `aamp: MESSAGE` and exit 1; anything else
is a bug and keeps its traceback.

Start-up is most of a command's cost, so two things are left until they are needed: the
client (and its socket) is imported only by an `Api` command, and only the typed
command's arguments are added to the parser (argparse's cost is per parser, and a command's
words never reach another command's parser). `aamp --help` lists every command from the
table either way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aamp.cli import agents, catalog, identity, local, runs, sandbox
from aamp.cli.command import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CommandError
from aamp.config import ConfigError, Settings

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from aamp.client import Client

Arguments = Callable[[argparse.ArgumentParser], None]
# How long an API command waits for each answer: the agent, run and approval commands longer.
API_TIMEOUT = 120.0
AGENT_API_TIMEOUT = 600.0


@dataclass(frozen=True)
class Api:
    help: str
    arguments: Arguments
    run: Callable[[Client, argparse.Namespace], int]
    timeout: float = API_TIMEOUT


@dataclass(frozen=True)
class Local:
    help: str
    run: Callable[[argparse.Namespace, Settings], int]
    arguments: Arguments | None = None


@dataclass(frozen=True)
class OwnWords:
    help: str
    run: Callable[[list[str]], int]


COMMANDS: dict[str, Api | Local | OwnWords] = {
    "up": Local("run the control plane (API on AAMP_HOST:AAMP_PORT)", local.up),
    "doctor": Local("say which isolation drivers work on this host and why not", local.doctor),
    "model": OwnWords("the optional local model: model serve [--port N] | model path", local.model),
    "image": Local("guest images", local.image, local.image_arguments),
    "sandbox": Api("sandboxes", sandbox.arguments, sandbox.run),
    "user": Api("users", identity.user_arguments, identity.user),
    "token": Api("API tokens", identity.token_arguments, identity.token),
    "grant": Api("per-agent grants", identity.grant_arguments, identity.grant),
    "policy": Api("policies", catalog.policy_arguments, catalog.policy),
    "service": Api("services", catalog.service_arguments, catalog.service),
    "model-endpoint": Api(
        "model endpoints (OpenAI-compatible servers agents may use)",
        catalog.model_endpoint_arguments,
        catalog.model_endpoint,
    ),
    "secret": Api("secrets (values are write-only)", identity.secret_arguments, identity.secret),
    "audit": Local("the audit log (local)", local.audit, local.audit_arguments),
    "agent": Api("agents", agents.agent_arguments, agents.agent, AGENT_API_TIMEOUT),
    "run": Api(
        "run an agent on a task (aamp run AGENT TASK), or: run ls|show|cancel|artifacts",
        runs.arguments,
        runs.run,
        AGENT_API_TIMEOUT,
    ),
    "approval": Api(
        "questions runs put to people (egress ask, outbound data)",
        agents.approval_arguments,
        agents.approval,
        AGENT_API_TIMEOUT,
    ),
}


def build_parser(arguments_of: Iterable[str] = COMMANDS) -> argparse.ArgumentParser:
    """The parser of every command, with the arguments of those named (by default all)."""
    p = argparse.ArgumentParser(prog="aamp", description="aamp control plane")
    sub = p.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        if isinstance(command, OwnWords):  # listed for --help; its words are its own
            sub.add_parser(name, help=command.help, add_help=False)
            continue
        parser = sub.add_parser(name, help=command.help)
        if command.arguments is not None and name in arguments_of:
            command.arguments(parser)
    return p


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = COMMANDS.get(words[0]) if words else None
    if isinstance(command, OwnWords):
        return command.run(words[1:])
    after_dashes: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, after_dashes = words[:cut], words[cut + 1 :]
    # The command's name is the first word that is not an option (`aamp` itself has only -h).
    typed = next((w for w in words if not w.startswith("-")), None)
    args = build_parser(arguments_of=[typed] if typed else []).parse_args(words)
    args.after_dashes = after_dashes  # the command `aamp sandbox exec` runs; others ignore it
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"aamp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run(COMMANDS[args.command], args, settings)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (CommandError, ValueError, OSError) as exc:
        print(f"aamp: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return EXIT_ERROR


def _run(command: Api | Local | OwnWords, args: argparse.Namespace, settings: Settings) -> int:
    if isinstance(command, Local):
        return command.run(args, settings)
    assert isinstance(command, Api)  # OwnWords commands returned before any parsing
    from aamp.client import Client, ClientError

    try:
        with Client.from_settings(settings, timeout=command.timeout) as client:
            return command.run(client, args)
    except ClientError as exc:
        raise CommandError(exc.message) from None
