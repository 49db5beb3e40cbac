"""The `aamp` command. Local commands (up, doctor, image) act on this host directly; sandbox
commands talk to the running control plane over its API."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from aamp.config import ConfigError, Settings

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TIMED_OUT = 124


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 24 * 3600:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 1 and 86400 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aamp", description="aamp control plane")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("up", help="run the control plane (API on AAMP_HOST:AAMP_PORT)")
    sub.add_parser("doctor", help="say which isolation drivers work on this host and why not")
    model = sub.add_parser(
        "model",
        help="the optional local model: model serve [--port N] | model path",
        add_help=False,
    )
    model.add_argument("rest", nargs=argparse.REMAINDER)

    image = sub.add_parser("image", help="guest images").add_subparsers(
        dest="action", required=True
    )
    build = image.add_parser("build", help="build a guest image (cached by content hash)")
    build.add_argument("name")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    image.add_parser("ls", help="list built images")
    prune = image.add_parser(
        "prune",
        help="delete every built image that is not current (images of live sandboxes are kept)",
    )
    prune.add_argument("--dry-run", action="store_true", help="only list what would be deleted")

    sb = sub.add_parser("sandbox", help="sandboxes").add_subparsers(dest="action", required=True)
    create = sb.add_parser("create", help="create a sandbox and print its id")
    _sandbox_options(create)
    ex = sb.add_parser("exec", help="run a command in a sandbox: exec ID -- CMD...")
    ex.add_argument("sandbox_id", nargs="?")
    ex.add_argument("--image", help="one-shot: create a sandbox from IMAGE, run, destroy it")
    ex.add_argument("--driver")
    ex.add_argument("--timeout", type=_positive_seconds, help="kill the command after SECONDS")
    ex.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    ex.add_argument("--cwd")
    cp = sb.add_parser("cp", help="copy a file: cp LOCAL ID:PATH  or  cp ID:PATH LOCAL")
    cp.add_argument("source")
    cp.add_argument("dest")
    sb.add_parser("ls", help="list sandboxes")
    rm = sb.add_parser("rm", help="destroy sandboxes")
    rm.add_argument("sandbox_ids", nargs="+")

    from aamp.cli_identity import add_parsers

    add_parsers(sub)
    from aamp.cli_agents import add_parsers as add_agent_parsers

    add_agent_parsers(sub)
    return p


def _sandbox_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", default="base")
    p.add_argument("--ttl", type=_positive_seconds, default=None, help="lifetime in seconds")
    p.add_argument("--idle", type=_positive_seconds, default=None, help="idle timeout in seconds")
    p.add_argument("--driver")
    p.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="a policy file (YAML); it sets image, lifetime, resources, egress and services",
    )


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["model"]:
        from aamp.agents.local_model import main as local_model

        return local_model(args_list[1:])
    command: list[str] = []
    if "--" in args_list:
        cut = args_list.index("--")
        args_list, command = args_list[:cut], args_list[cut + 1 :]
    args = build_parser().parse_args(args_list)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"aamp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _dispatch(args, command, settings)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from aamp.client import ClientError
        from aamp.sandbox.image_recipes import ImageBuildError

        if isinstance(exc, ClientError | ValueError | OSError | ImageBuildError):
            print(f"aamp: {getattr(exc, 'message', exc)}", file=sys.stderr)
            return EXIT_ERROR
        raise


def _dispatch(args: argparse.Namespace, command: list[str], settings: Settings) -> int:
    if args.command == "up":
        from aamp.server import serve

        serve(settings)
        return 0
    if args.command == "doctor":
        from aamp.doctor import report

        text, ok = report(settings)
        print(text)
        return 0 if ok else EXIT_ERROR
    if args.command == "image":
        return _image(args, settings)
    if args.command in ("agent", "run", "approval"):
        from aamp.cli_agents import dispatch as dispatch_agents

        return dispatch_agents(args, settings, _table)
    if args.command != "sandbox":
        from aamp.cli_identity import dispatch

        return dispatch(args, settings, _table)
    return _sandbox(args, command, settings)


def _image(args: argparse.Namespace, settings: Settings) -> int:
    from aamp.egress.ca import InstallationCA, ca_dir
    from aamp.sandbox.images import ImageStore

    store = ImageStore(settings)
    if args.action == "build":
        # Every image trusts the installation's CA, so services' intercepted TLS verifies.
        ca = InstallationCA.load_or_create(ca_dir(settings))
        started = time.monotonic()

        def progress(line: str) -> None:
            print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

        img = store.build(args.name, progress=progress, force=args.force, ca_cert=ca.cert_path)
        print(
            f"{img.name} {img.content_hash[:16]} {_size(img.size_bytes)} "
            f"(ext4 {_size(img.ext4_bytes)}) in {time.monotonic() - started:.1f}s"
        )
        return 0
    if args.action == "prune":
        # Progress (what is removed, and what is kept because a live sandbox uses it) goes to
        # stderr as it happens; stdout gets one row per removed directory and the total.
        pruned = store.prune(
            dry_run=args.dry_run,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        table = [("NAME", "HASH", "SIZE")]
        for name, content_hash, size in pruned:
            shown = content_hash if content_hash.startswith(".") else content_hash[:16]
            table.append((name, shown, _size(size)))
        if pruned:
            _table(table)
        total = _size(sum(p.size_bytes for p in pruned))
        if args.dry_run:
            print(f"{len(pruned)} would be removed, freeing {total} (dry run: nothing changed)")
        else:
            print(f"{len(pruned)} removed, freed {total}")
        return 0
    rows = [("NAME", "HASH", "SIZE", "EXT4", "BUILT")]
    for img in store.list():
        rows.append(
            (
                img.name,
                img.content_hash[:16],
                _size(img.size_bytes),
                _size(img.ext4_bytes),
                img.built_at.strftime("%Y-%m-%d %H:%M:%SZ"),
            )
        )
    _table(rows)
    return 0


def _sandbox(args: argparse.Namespace, command: list[str], settings: Settings) -> int:
    from aamp.client import ApiClient

    client = ApiClient(settings)
    try:
        if args.action == "create":
            body = _create_body(args)
            print(client.create_sandbox(**body)["id"])
            return 0
        if args.action == "exec":
            return _exec(client, args, command)
        if args.action == "cp":
            return _cp(client, args.source, args.dest)
        if args.action == "ls":
            rows = [("ID", "IMAGE", "DRIVER", "AGE", "EXPIRES IN")]
            for s in client.list_sandboxes():
                age = time.time() - s["created_at"]
                rows.append(
                    (s["id"], s["image"], s["driver"], f"{age:.0f}s", f"{s['expires_in']:.0f}s")
                )
            _table(rows)
            return 0
        if args.action == "rm":
            failed = 0
            for sandbox_id in args.sandbox_ids:
                try:
                    client.delete_sandbox(sandbox_id)
                    print(sandbox_id)
                except Exception as exc:
                    print(f"aamp: {getattr(exc, 'message', exc)}", file=sys.stderr)
                    failed += 1
            return EXIT_ERROR if failed else 0
    finally:
        client.close()
    return EXIT_USAGE


def _create_body(args: argparse.Namespace) -> dict[str, object]:
    body: dict[str, object] = {"image": args.image}
    if getattr(args, "policy", None) is not None:
        try:
            body["policy_document"] = args.policy.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read the policy file {args.policy}: {exc.strerror}") from None
    if args.driver:
        body["driver"] = args.driver
    if getattr(args, "ttl", None):
        body["ttl_seconds"] = args.ttl
    if getattr(args, "idle", None):
        body["idle_seconds"] = args.idle
    return body


def _exec(client, args: argparse.Namespace, command: list[str]) -> int:
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
                print(f"aamp: {event['message']}", file=sys.stderr)
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


def _cp(client, source: str, dest: str) -> int:
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


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
