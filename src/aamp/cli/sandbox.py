"""`aamp sandbox create|exec|cp|ls|rm`, over the API.

`exec` streams the command's output as it comes and exits with the command's exit code (124
when it timed out, 128+N when signal N ended it); `exec --image NAME` is one-shot: a sandbox is
made, used and destroyed. `cp` copies one file: `cp LOCAL ID:PATH` or `cp ID:PATH LOCAL`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from aamp.cli.command import EXIT_ERROR, EXIT_TIMED_OUT, EXIT_USAGE
from aamp.cli.output import shown, table
from aamp.cli.parsing import action, actions

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from typing import Any

    from aamp.client import Client


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 24 * 3600:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 1 and 86400 seconds")
    return value


def sandbox_arguments(p: argparse.ArgumentParser) -> None:
    sb = actions(p)
    create = action(sb, "create", "create a sandbox and print its id")
    create.add_argument("--image", help="the guest image (default base; a --policy sets it)")
    create.add_argument("--ttl", type=_positive_seconds, default=None, help="lifetime in seconds")
    create.add_argument(
        "--idle", type=_positive_seconds, default=None, help="idle timeout in seconds"
    )
    create.add_argument("--driver")
    create.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="a policy file (YAML); it sets image, lifetime, resources, egress and services",
    )
    ex = action(sb, "exec", "run a command in a sandbox: exec ID -- CMD...")
    ex.add_argument("sandbox_id", nargs="?")
    ex.add_argument("--image", help="one-shot: create a sandbox from IMAGE, run, destroy it")
    ex.add_argument("--driver")
    ex.add_argument("--timeout", type=_positive_seconds, help="kill the command after SECONDS")
    ex.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    ex.add_argument("--cwd")
    action(sb, "cp", "copy a file: cp LOCAL ID:PATH  or  cp ID:PATH LOCAL", "source", "dest")
    action(sb, "ls", "list sandboxes")
    rm = action(sb, "rm", "destroy sandboxes")
    rm.add_argument("sandbox_ids", nargs="+")


def sandbox(client: Client, args: argparse.Namespace) -> int:
    if args.action == "create":
        print(client.create_sandbox(**_create_body(args))["id"])
        return 0
    if args.action == "exec":
        return _exec(client, args, args.after_dashes)
    if args.action == "cp":
        return _cp(client, args.source, args.dest)
    if args.action == "ls":
        rows = [("ID", "IMAGE", "DRIVER", "AGE", "EXPIRES IN")]
        for s in client.list_sandboxes():
            age = time.time() - s["created_at"]
            rows.append(
                (s["id"], s["image"], s["driver"], f"{age:.0f}s", f"{s['expires_in']:.0f}s")
            )
        table(rows)
        return 0
    failed = 0
    for sandbox_id in args.sandbox_ids:
        try:
            client.delete_sandbox(sandbox_id)
            print(sandbox_id)
        except Exception as exc:
            print(f"aamp: {shown(getattr(exc, 'message', exc))}", file=sys.stderr)
            failed += 1
    return EXIT_ERROR if failed else 0


def _create_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.image:
        body["image"] = args.image
    if args.policy is not None:
        try:
            body["policy_document"] = args.policy.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read the policy file {args.policy}: {exc.strerror}") from None
    if args.driver:
        body["driver"] = args.driver
    if args.ttl:
        body["ttl_seconds"] = args.ttl
    if args.idle:
        body["idle_seconds"] = args.idle
    return body


def _exec(client: Client, args: argparse.Namespace, command: list[str]) -> int:
    if not command:
        print("aamp: give the command after --, e.g. aamp sandbox exec ID -- ls", file=sys.stderr)
        return EXIT_USAGE
    if bool(args.sandbox_id) == bool(args.image):
        print("aamp: give either a sandbox ID or --image NAME (one-shot)", file=sys.stderr)
        return EXIT_USAGE
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"aamp: --env {item!r} must look like KEY=VALUE", file=sys.stderr)
            return EXIT_USAGE
        env[key] = value
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    sandbox_id = args.sandbox_id
    if args.image:
        body = {"image": args.image, "ttl_seconds": (args.timeout or 3600) + 60}
        if args.driver:
            body["driver"] = args.driver
        sandbox_id = client.create_sandbox(**body)["id"]
    # Ctrl-C ends the remote command too: closing the stream makes the server kill it.
    try:
        for event in client.exec(
            sandbox_id, command, env=env, cwd=args.cwd, stdin=stdin, timeout=args.timeout
        ):
            if "data" in event:
                out = sys.stdout if event["stream"] == "stdout" else sys.stderr
                out.buffer.write(event["data"])
                out.flush()
            elif "error" in event:
                print(f"aamp: {shown(event['message'])}", file=sys.stderr)
                return EXIT_ERROR
            else:
                if event.get("timed_out"):
                    print("aamp: the command timed out", file=sys.stderr)
                    return EXIT_TIMED_OUT
                if event.get("signal"):
                    return 128 + int(event["signal"])
                return int(event.get("exit_code") or 0)
        print("aamp: the exec stream ended without a result", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if args.image:
            client.delete_sandbox(sandbox_id)


def _cp(client: Client, source: str, dest: str) -> int:
    src_remote, dst_remote = _remote(source), _remote(dest)
    if bool(src_remote) == bool(dst_remote):
        print("aamp: exactly one side of cp must be ID:PATH", file=sys.stderr)
        return EXIT_USAGE
    if dst_remote:
        local = Path(source)
        if not local.is_file():
            print(f"aamp: {source} is not a file", file=sys.stderr)
            return EXIT_ERROR
        client.put_file(dst_remote[0], local, dst_remote[1])
        return 0
    assert src_remote is not None
    local = Path(dest)
    if local.is_dir():
        local = local / Path(src_remote[1]).name
    client.get_file(src_remote[0], src_remote[1], local)
    return 0


def _remote(arg: str) -> tuple[str, str] | None:
    head, sep, tail = arg.partition(":")
    if sep and head.startswith("sb-") and "/" not in head:
        return head, tail
    return None
