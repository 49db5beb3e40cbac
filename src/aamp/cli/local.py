"""The commands that act on this host directly, not through the API: `up`, `doctor`, `model`,
`image build|ls|prune` and `audit verify|export` (which read the store, so they work with the
control plane stopped).

This is the only module of the CLI that imports the server side, and only inside the command
that needs it: every other command starts without loading the store, vault, audit log or
sandbox drivers. Each server name is imported in one place here, so a module that moves is a
one-line change.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from aamp.cli.command import EXIT_ERROR, EXIT_USAGE, CommandError
from aamp.cli.output import size, table
from aamp.cli.parsing import action, actions

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from aamp.config import Settings
    from aamp.sandbox.images import ImageStore


def up_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--role",
        choices=("both", "api"),
        default="both",
        help="both (default): the API and this machine's own sandbox host; api: a"
        " control-plane replica that runs no sandboxes, placing every one on registered hosts"
        " (`aamp host serve`; needs PostgreSQL)",
    )


def up(args: argparse.Namespace, settings: Settings) -> int:
    from aamp.server import serve

    with _image_errors():
        serve(settings, args.role)
    return 0


def doctor(args: argparse.Namespace, settings: Settings) -> int:
    from aamp.doctor import report

    with _image_errors():
        text, ok = report(settings)
    print(text)
    return 0 if ok else EXIT_ERROR


def model(words: list[str]) -> int:
    """`aamp model ...`: the local model's own command line parses every word after `model`."""
    from aamp.agents.local_model import main

    return main(words)


def bundle(words: list[str]) -> int:
    """`aamp bundle create|verify ...`: scripts/bundle's and the install's own command lines."""
    if words and words[0] == "create":
        from aamp.bundle import main

        return main(words[1:])
    if words and words[0] == "verify":
        from aamp.bundle import check_main

        return check_main(words[1:])
    print(
        "usage: aamp bundle create OUT [--sign KEY] [--wheelhouse FILE]"
        " | aamp bundle verify PATH [--trust PUB]"
    )
    return EXIT_USAGE


def image_arguments(p: argparse.ArgumentParser) -> None:
    image = actions(p)
    build = action(image, "build", "build a guest image (cached by content hash)", "name")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    action(image, "ls", "list built images")
    prune = action(
        image,
        "prune",
        "delete every built image that is not current (images of live sandboxes are kept)",
    )
    prune.add_argument("--dry-run", action="store_true", help="only list what would be deleted")


def image(args: argparse.Namespace, settings: Settings) -> int:
    from aamp.sandbox.images import ImageStore

    with _image_errors():
        store = ImageStore(settings)
        if args.action == "build":
            return _build(store, settings, args.name, force=args.force)
        if args.action == "prune":
            return _prune(store, dry_run=args.dry_run)
        rows = [("NAME", "HASH", "SIZE", "EXT4", "BUILT")]
        for img in store.list():
            rows.append(
                (
                    img.name,
                    img.content_hash[:16],
                    size(img.size_bytes),
                    size(img.ext4_bytes),
                    img.built_at.strftime("%Y-%m-%d %H:%M:%SZ"),
                )
            )
        table(rows)
        return 0


def _build(store: ImageStore, settings: Settings, name: str, *, force: bool) -> int:
    from aamp.egress.ca import ca_cert_path

    # Every image trusts the installation's CA, so services' intercepted TLS verifies.
    ca_cert = ca_cert_path(settings)
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    img = store.build(name, progress=progress, force=force, ca_cert=ca_cert)
    print(
        f"{img.name} {img.content_hash[:16]} {size(img.size_bytes)} "
        f"(ext4 {size(img.ext4_bytes)}) in {time.monotonic() - started:.1f}s"
    )
    return 0


def _prune(store: ImageStore, *, dry_run: bool) -> int:
    # Progress (what is removed, and what is kept because a live sandbox uses it) goes to
    # stderr as it happens; stdout gets one row per removed directory and the total.
    pruned = store.prune(
        dry_run=dry_run, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    rows = [("NAME", "HASH", "SIZE")]
    for name, content_hash, nbytes in pruned:
        shown = content_hash if content_hash.startswith(".") else content_hash[:16]
        rows.append((name, shown, size(nbytes)))
    if pruned:
        table(rows)
    total = size(sum(p.size_bytes for p in pruned))
    if dry_run:
        print(f"{len(pruned)} would be removed, freeing {total} (dry run: nothing changed)")
    else:
        print(f"{len(pruned)} removed, freed {total}")
    return 0


@contextlib.contextmanager
def _image_errors() -> Iterator[None]:
    """A failed image build (here, or while `up` warms its pool) is said in one line."""
    from aamp.sandbox.images import ImageBuildError

    try:
        yield
    except ImageBuildError as exc:
        raise CommandError(str(exc)) from None


def audit_arguments(p: argparse.ArgumentParser) -> None:
    audit = actions(p)
    av = action(audit, "verify", "check the whole chain and its witness; name the first bad record")
    av.add_argument(
        "--witness",
        metavar="FILE",
        help="check against this witness (e.g. a forwarded copy) instead of "
        "$AAMP_HOME/audit-witness.jsonl",
    )
    ae = action(audit, "export", "write JSON lines")
    ae.add_argument("--since", help="ISO 8601 time (with zone) or a record number")
    ae.add_argument("-o", "--output", help="file to write (default stdout)")


def audit(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import datetime

    from aamp.audit import (
        SIGNING_KEY_FILENAME,
        WITNESS_FILENAME,
        CheckpointSigner,
        WitnessReader,
        export,
        verify,
    )
    from aamp.store import Store

    key_path = settings.home / SIGNING_KEY_FILENAME
    with Store.open(settings, upgrade=False) as store:
        if args.action == "verify":
            keys = CheckpointSigner.load(key_path).trusted_keys() if key_path.exists() else {}
            if args.witness and not Path(args.witness).is_file():
                raise ValueError(f"--witness {args.witness}: no such file")
            witness_path = Path(args.witness) if args.witness else settings.home / WITNESS_FILENAME
            # Made before the chain's head is read: every line it holds is then in the chain.
            report = verify(store, keys, witness=WitnessReader(witness_path, keys))
            print(report.summary())
            return 0 if report.ok else 1
        since: datetime | int | None = None
        if args.since:
            if args.since.isdigit():
                since = int(args.since)
            else:
                since = datetime.fromisoformat(args.since.replace("Z", "+00:00"))
                if since.tzinfo is None:
                    raise ValueError("--since needs a time zone, e.g. 2025-01-01T00:00:00Z")
        keys_pub = (
            {k: v for k, v in CheckpointSigner.load(key_path).trusted_keys().items()}
            if key_path.exists()
            else None
        )
        if args.output:
            with open(args.output, "w", encoding="utf-8") as out:
                count = export(store, out, since=since, public_keys=keys_pub)
            print(f"{count} records written to {args.output}", file=sys.stderr)
        else:
            export(store, sys.stdout, since=since, public_keys=keys_pub)
    return 0
