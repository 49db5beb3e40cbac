"""`aamp user|token|grant|secret`: people, their API tokens, per-agent grants and the vault's
secrets (values go in, never come out), over the API as the CLI token's holder or AAMP_TOKEN."""

from __future__ import annotations

import argparse
import sys

from aamp.cli.output import table
from aamp.cli.parsing import action, actions
from aamp.cli.refs import agent_id

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from typing import Any

    from aamp.client import Client

ROLES = ["admin", "builder", "operator"]


def user_arguments(p: argparse.ArgumentParser) -> None:
    user = actions(p)
    add = action(user, "add", "add a user (password from stdin, or generated)", "username")
    add.add_argument("--role", required=True, choices=ROLES)
    add.add_argument("--password-stdin", action="store_true")
    action(user, "ls", "list users")
    role = action(user, "role", "change a user's role", "username")
    role.add_argument("role", choices=ROLES)
    dis = action(user, "disable", "disable a user (or --enable)", "username")
    dis.add_argument("--enable", action="store_true")


def token_arguments(p: argparse.ArgumentParser) -> None:
    token = actions(p)
    tc = action(token, "create", "create a token for yourself, or --for USER (printed once)")
    tc.add_argument("--name", default="api")
    tc.add_argument("--for", dest="for_user", metavar="USER", help="admins: a token for USER")
    tc.add_argument("--expires", type=_days, metavar="DAYS", help="e.g. 30d (whole days)")
    action(token, "ls", "list tokens")
    action(token, "revoke", "revoke a token", "token_id")


def _days(text: str) -> int:
    """`30d` or `30`: tokens expire after whole days (the API's unit)."""
    digits = text.removesuffix("d")
    if not digits.isdigit() or int(digits) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole days, such as 30d")
    return int(digits)


def grant_arguments(p: argparse.ArgumentParser) -> None:
    grant = actions(p)
    ga = action(grant, "add", "give a user or role view|run|edit on an agent")
    ga.add_argument("agent", help="agent id or name")
    who = ga.add_mutually_exclusive_group(required=True)
    who.add_argument("--user")
    who.add_argument("--role", choices=ROLES)
    ga.add_argument("--level", required=True, choices=["view", "run", "edit"])
    action(grant, "ls", "list an agent's grants and granted resources", "agent")
    gr = action(grant, "rm", "remove a grant", "agent")
    gr.add_argument("grant_id", type=int)
    for name, text in (("attach", "grant an agent a resource"), ("detach", "take it back")):
        r = action(
            grant,
            name,
            f"{text}: policy, service, image, model-endpoint or knowledge-base",
            "agent",
        )
        kinds = ["policy", "service", "image", "model-endpoint", "knowledge-base"]
        r.add_argument("kind", choices=kinds)
        r.add_argument("name")


def secret_arguments(p: argparse.ArgumentParser) -> None:
    secret = actions(p)
    action(secret, "set", "set a secret's value, read from stdin", "name")
    action(secret, "ls", "list secrets (names, never values)")
    action(secret, "rm", "delete a secret", "name")
    rewrap = "re-wrap every secret under a new master key (values unchanged)"
    action(secret, "rotate-master-key", rewrap)


def user(client: Client, args: argparse.Namespace) -> int:
    if args.action == "add":
        generated = None
        if args.password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = generated = _generated_password()
        body = {"username": args.username, "role": args.role, "password": password}
        client.call("POST", "/v1/users", json=body)
        print(args.username + (f" password: {generated} (shown only now)" if generated else ""))
        return 0
    if args.action == "ls":
        rows = [("USERNAME", "ROLE", "STATUS", "CREATED")]
        for u in client.call("GET", "/v1/users"):
            status = "disabled" if u["disabled"] else "active"
            rows.append((u["username"], u["role"], status, u["created_at"][:19]))
        table(rows)
        return 0
    if args.action == "role":
        client.call("PATCH", f"/v1/users/{args.username}", json={"role": args.role})
        return 0
    client.call("PATCH", f"/v1/users/{args.username}", json={"disabled": not args.enable})
    return 0


def _generated_password() -> str:
    """As strong as the ones `aamp up` makes: 24 URL-safe characters from `secrets`."""
    import secrets

    return secrets.token_urlsafe(18)


def token(client: Client, args: argparse.Namespace) -> int:
    if args.action == "create":
        body: dict[str, Any] = {"name": args.name}
        if args.expires:
            body["expires_in_days"] = args.expires
        path = f"/v1/users/{args.for_user}/tokens" if args.for_user else "/v1/tokens"
        made = client.call("POST", path, json=body)
        print(f"{made['id']} {made['token']}")
        print("the token is shown only now; keep it safe", file=sys.stderr)
        return 0
    if args.action == "ls":
        rows = [("ID", "USER", "NAME", "EXPIRES", "REVOKED", "LAST USED")]
        for t in client.call("GET", "/v1/tokens"):
            rows.append(
                (
                    t["id"],
                    t["username"],
                    t["name"],
                    (t["expires_at"] or "never")[:19],
                    (t["revoked_at"] or "-")[:19],
                    (t["last_used_at"] or "-")[:19],
                )
            )
        table(rows)
        return 0
    client.call("DELETE", f"/v1/tokens/{args.token_id}")
    return 0


def grant(client: Client, args: argparse.Namespace) -> int:
    agent = agent_id(client, args.agent)
    if args.action == "add":
        body = {"level": args.level, "user": args.user, "role": args.role}
        made = client.call("POST", f"/v1/agents/{agent}/grants", json=body)
        print(made["id"])
        return 0
    if args.action == "ls":
        rows = [("ID", "SUBJECT", "LEVEL", "BY")]
        for g in client.call("GET", f"/v1/agents/{agent}/grants"):
            subject = f"user {g['user']}" if g["user"] else f"role {g['role']}"
            rows.append((str(g["id"]), subject, g["level"], g["created_by"]))
        for res in client.call("GET", f"/v1/agents/{agent}/resources"):
            rows.append(("-", f"{res['kind']} {res['name']}", "granted", res["created_by"]))
        table(rows)
        return 0
    if args.action == "rm":
        client.call("DELETE", f"/v1/agents/{agent}/grants/{args.grant_id}")
        return 0
    if args.action == "attach":
        body = {"kind": args.kind, "name": args.name}
        client.call("POST", f"/v1/agents/{agent}/resources", json=body)
        return 0
    client.call("DELETE", f"/v1/agents/{agent}/resources/{args.kind}/{args.name}")
    return 0


def secret(client: Client, args: argparse.Namespace) -> int:
    if args.action == "set":
        if sys.stdin is None or sys.stdin.isatty():
            import getpass

            value = getpass.getpass(f"value for {args.name}: ")
        else:
            value = sys.stdin.read().rstrip("\n")
        meta = client.call("PUT", f"/v1/secrets/{args.name}", json={"value": value})
        print(f"{meta['name']} version {meta['version']}")
        return 0
    if args.action == "ls":
        rows = [("NAME", "VERSION", "SET BY", "SET AT", "USED BY")]
        for s in client.call("GET", "/v1/secrets"):
            rows.append(
                (
                    s["name"],
                    str(s["version"]),
                    s["updated_by"],
                    s["updated_at"][:19],
                    ",".join(s["used_by"]) or "-",
                )
            )
        table(rows)
        return 0
    if args.action == "rotate-master-key":
        print(f"new master key {client.call('POST', '/v1/vault/rotate')['key_id']}")
        return 0
    client.call("DELETE", f"/v1/secrets/{args.name}")
    return 0
