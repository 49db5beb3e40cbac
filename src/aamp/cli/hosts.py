"""`aamp host add|ls|drain|rm`: the fleet's sandbox hosts, over the API (admins); and
`aamp host serve`, which runs a sandbox host on this machine (`aamp.fleet.host_process`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from aamp.cli.output import table
from aamp.cli.parsing import action, actions

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from aamp.client import Client


def host_arguments(p: argparse.ArgumentParser) -> None:
    host = actions(p)
    add = action(
        host, "add", "add a host; prints the token it registers with (shown only now)", "id"
    )
    add.add_argument(
        "--out",
        metavar="DIR",
        help="also write the token and the host's link certificate, key and CA there (0600),"
        " for `aamp host serve --cert-dir DIR`",
    )
    serve = action(host, "serve", "run a sandbox host on this machine (needs root and a driver)")
    serve.add_argument("--id", help="the host's id (default AAMP_FLEET_HOST_ID)")
    serve.add_argument("--control-plane", required=True, metavar="URL", help="a replica's API URL")
    serve.add_argument(
        "--cert-dir", required=True, metavar="DIR", help="from `aamp host add ID --out DIR`"
    )
    serve.add_argument("--listen", default="127.0.0.1:7443", metavar="HOST:PORT")
    serve.add_argument(
        "--advertise", metavar="HOST:PORT", help="where replicas reach the link (default --listen)"
    )
    action(host, "ls", "list hosts: state, last heartbeat, capacity used, sandboxes")
    action(host, "drain", "send no new work to a host; its sandboxes may finish", "id")
    action(host, "rm", "forget a drained or lost host", "id")


def host(client: Client, args: argparse.Namespace) -> int:
    if args.action == "add":
        added = client.call("POST", "/v1/hosts", json={"id": args.id})
        if args.out:
            _write_credentials(Path(args.out), added)
        print(added["token"])
        return 0
    if args.action == "ls":
        rows = [("ID", "STATE", "EPOCH", "LAST HEARTBEAT", "CPUS", "MEMORY MB", "SANDBOXES")]
        for h in client.call("GET", "/v1/hosts"):
            rows.append(
                (
                    h["id"],
                    h["state"],
                    str(h["epoch"]),
                    h["heartbeat_at"] or "never",
                    f"{h['used_cpus']:g}/{h['cpus']:g}",
                    f"{h['used_memory_mb']}/{h['memory_mb']}",
                    f"{h['used_sandboxes']}/{h['sandboxes']}",
                )
            )
        table(rows)
        return 0
    if args.action == "drain":
        print(client.call("POST", f"/v1/hosts/{args.id}/drain")["state"])
        return 0
    client.call("DELETE", f"/v1/hosts/{args.id}")
    return 0


CREDENTIAL_FILES = {"host.token": "token", "host.crt": "link_cert", "host.key": "link_key",
                    "ca.crt": "link_ca"}  # fmt: skip


def _write_credentials(directory: Path, added: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, key in CREDENTIAL_FILES.items():
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(added[key])


def host_local(args: argparse.Namespace, settings: object) -> int:
    """`aamp host serve`: this machine's sandbox host, until it is stopped."""
    from aamp.fleet.host_serve import serve_host

    return serve_host(args, settings)
