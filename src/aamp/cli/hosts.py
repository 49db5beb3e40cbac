"""`aamp host add|ls|drain|rm`: the fleet's sandbox hosts, over the API (admins)."""

from __future__ import annotations

import argparse

from aamp.cli.output import table
from aamp.cli.parsing import action, actions

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from aamp.client import Client


def host_arguments(p: argparse.ArgumentParser) -> None:
    host = actions(p)
    action(host, "add", "add a host; prints the token it registers with (shown only now)", "id")
    action(host, "ls", "list hosts: state, last heartbeat, capacity used, sandboxes")
    action(host, "drain", "send no new work to a host; its sandboxes may finish", "id")
    action(host, "rm", "forget a drained or lost host", "id")


def host(client: Client, args: argparse.Namespace) -> int:
    if args.action == "add":
        added = client.call("POST", "/v1/hosts", json={"id": args.id})
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
