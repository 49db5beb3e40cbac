"""`aamp wheelhouse add|ls|rm`: the installation's offline wheelhouse, the only source of a
policy's `packages:`, over the API. `add REQ...` has the control plane download the wheels
(and their dependencies) for the guest's Python; `add --from DIR` uploads the wheel files in
DIR, brought on media to a site without any index."""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import quote

from aamp.cli.output import size, table
from aamp.cli.parsing import action, actions

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from typing import Any

    from aamp.client import Client


def wheelhouse_arguments(p: argparse.ArgumentParser) -> None:
    wheelhouse = actions(p)
    add = action(wheelhouse, "add", "add wheels: download REQ... (with deps), or --from DIR")
    add.add_argument("requirements", nargs="*", metavar="REQ", help="e.g. tabulate==0.9.0")
    add.add_argument("--from", dest="source", metavar="DIR", help="a directory of .whl files")
    action(wheelhouse, "ls", "list the wheels")
    rm = action(wheelhouse, "rm", "remove a package's wheels", "name")
    rm.add_argument("--version", help="only this version")


def _print(wheels: list[dict[str, Any]]) -> None:
    rows = [("NAME", "VERSION", "SIZE", "SHA-256", "FILE")]
    for w in wheels:
        rows.append((w["name"], w["version"], size(w["size"]), w["sha256"][:16], w["filename"]))
    table(rows)


def wheelhouse(client: Client, args: argparse.Namespace) -> int:
    if args.action == "ls":
        _print(client.call("GET", "/v1/wheelhouse"))
        return 0
    if args.action == "rm":
        params = {"version": args.version} if args.version else {}
        _print(client.call("DELETE", f"/v1/wheelhouse/{quote(args.name)}", params=params))
        return 0
    if bool(args.requirements) == bool(args.source):
        raise ValueError("wheelhouse add: give requirements or --from DIR (one of the two)")
    if args.requirements:
        _print(client.call("POST", "/v1/wheelhouse", json={"requirements": args.requirements}))
        return 0
    files = sorted(Path(args.source).glob("*.whl"))
    if not files:
        raise ValueError(f"{args.source}: no .whl files there")
    added: list[dict[str, Any]] = []
    for path in files:
        added += client.call(
            "PUT", f"/v1/wheelhouse/wheels/{quote(path.name)}", content=path.read_bytes()
        )
    _print(added)
    return 0
