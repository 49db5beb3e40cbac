"""The `aamp user|token|grant|policy|service|model-endpoint|secret|audit` commands.

All but `audit` talk to the running control plane through its API (as the holder of the CLI
token, or AAMP_TOKEN); `audit verify|export` read the store directly on this host, so they
work with the control plane stopped.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from aamp.config import Settings


def add_parsers(sub: Any) -> None:
    user = sub.add_parser("user", help="users").add_subparsers(dest="action", required=True)
    add = user.add_parser("add", help="add a user (password from stdin, or generated)")
    add.add_argument("username")
    add.add_argument("--role", required=True, choices=["admin", "builder", "operator"])
    add.add_argument("--password-stdin", action="store_true")
    user.add_parser("ls", help="list users")
    role = user.add_parser("role", help="change a user's role")
    role.add_argument("username")
    role.add_argument("role", choices=["admin", "builder", "operator"])
    dis = user.add_parser("disable", help="disable a user (or --enable)")
    dis.add_argument("username")
    dis.add_argument("--enable", action="store_true")

    token = sub.add_parser("token", help="API tokens").add_subparsers(dest="action", required=True)
    tc = token.add_parser("create", help="create a token for yourself (printed once)")
    tc.add_argument("--name", default="api")
    tc.add_argument("--expires-days", type=int)
    token.add_parser("ls", help="list tokens")
    tr = token.add_parser("revoke", help="revoke a token")
    tr.add_argument("token_id")

    grant = sub.add_parser("grant", help="per-agent grants").add_subparsers(
        dest="action", required=True
    )
    ga = grant.add_parser("add", help="give a user or role view|run|edit on an agent")
    ga.add_argument("agent", help="agent id or name")
    who = ga.add_mutually_exclusive_group(required=True)
    who.add_argument("--user")
    who.add_argument("--role", choices=["admin", "builder", "operator"])
    ga.add_argument("--level", required=True, choices=["view", "run", "edit"])
    gl = grant.add_parser("ls", help="list an agent's grants and granted resources")
    gl.add_argument("agent")
    gr = grant.add_parser("rm", help="remove a grant")
    gr.add_argument("agent")
    gr.add_argument("grant_id", type=int)
    for name, text in (("attach", "grant an agent a resource"), ("detach", "take it back")):
        p = grant.add_parser(name, help=f"{text}: policy, service, image or model-endpoint")
        p.add_argument("agent")
        p.add_argument("kind", choices=["policy", "service", "image", "model-endpoint"])
        p.add_argument("name")

    policy = sub.add_parser("policy", help="policies").add_subparsers(dest="action", required=True)
    pp = policy.add_parser("put", help="create or replace a policy from a YAML or JSON file")
    pp.add_argument("file")
    policy.add_parser("ls", help="list policies")
    ps = policy.add_parser("show", help="print a policy's document")
    ps.add_argument("name")
    pr = policy.add_parser("rm", help="delete a policy")
    pr.add_argument("name")

    service = sub.add_parser("service", help="services").add_subparsers(
        dest="action", required=True
    )
    sp = service.add_parser("put", help="define a service")
    sp.add_argument("name")
    sp.add_argument("--upstream", required=True)
    sp.add_argument("--auth", required=True, choices=["bearer", "basic", "header"])
    sp.add_argument("--secret", action="append", default=[], dest="secrets")
    sp.add_argument("--header-name")
    service.add_parser("ls", help="list services")
    sr = service.add_parser("rm", help="delete a service")
    sr.add_argument("name")

    endpoint = sub.add_parser(
        "model-endpoint", help="model endpoints (OpenAI-compatible servers agents may use)"
    ).add_subparsers(dest="action", required=True)
    ep = endpoint.add_parser("put", help="register (or replace) a model endpoint")
    ep.add_argument("name")
    ep.add_argument("--base-url", required=True, help="e.g. http://llm.internal:8080/v1")
    ep.add_argument("--api-key-secret", help="the vault secret holding its API key")
    ep.add_argument("--models", default="", help="the model names it serves: a,b (none: any)")
    endpoint.add_parser("ls", help="list model endpoints")
    es = endpoint.add_parser("show", help="print a model endpoint")
    es.add_argument("name")
    ec = endpoint.add_parser("confirm", help="confirm an endpoint migration 0005 made")
    ec.add_argument("name")
    er = endpoint.add_parser("rm", help="delete a model endpoint")
    er.add_argument("name")

    secret = sub.add_parser("secret", help="secrets (values are write-only)").add_subparsers(
        dest="action", required=True
    )
    ss = secret.add_parser("set", help="set a secret's value, read from stdin")
    ss.add_argument("name")
    secret.add_parser("ls", help="list secrets (names, never values)")
    sx = secret.add_parser("rm", help="delete a secret")
    sx.add_argument("name")
    secret.add_parser(
        "rotate-master-key", help="re-wrap every secret under a new master key (values unchanged)"
    )

    audit = sub.add_parser("audit", help="the audit log (local)").add_subparsers(
        dest="action", required=True
    )
    av = audit.add_parser(
        "verify", help="check the whole chain and its witness; name the first bad record"
    )
    av.add_argument(
        "--witness",
        metavar="FILE",
        help="check against this witness (e.g. a forwarded copy) instead of "
        "$AAMP_HOME/audit-witness.jsonl",
    )
    ae = audit.add_parser("export", help="write JSON lines")
    ae.add_argument("--since", help="ISO 8601 time (with zone) or a record number")
    ae.add_argument("-o", "--output", help="file to write (default stdout)")


def dispatch(args: argparse.Namespace, settings: Settings, table: Any) -> int:
    if args.command == "audit":
        return _audit(args, settings)
    from aamp.client import ApiClient

    client = ApiClient(settings)
    try:
        handler = {
            "user": _user,
            "token": _token,
            "grant": _grant,
            "policy": _policy,
            "service": _service,
            "model-endpoint": _model_endpoint,
            "secret": _secret,
        }[args.command]
        return handler(client, args, table)
    finally:
        client.close()


def _user(client: Any, args: argparse.Namespace, table: Any) -> int:
    if args.action == "add":
        generated = None
        if args.password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            from aamp.identity.credentials import generate_password

            password = generated = generate_password()
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


def _token(client: Any, args: argparse.Namespace, table: Any) -> int:
    if args.action == "create":
        body: dict[str, Any] = {"name": args.name}
        if args.expires_days:
            body["expires_in_days"] = args.expires_days
        made = client.call("POST", "/v1/tokens", json=body)
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


def _agent_id(client: Any, ref: str) -> str:
    if ref.startswith("ag-"):
        return ref
    for agent in client.call("GET", "/v1/agents"):
        if agent["name"] == ref:
            return str(agent["id"])
    raise ValueError(f"no agent named {ref!r} that you can see")


def _grant(client: Any, args: argparse.Namespace, table: Any) -> int:
    agent = _agent_id(client, args.agent)
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


def _policy(client: Any, args: argparse.Namespace, table: Any) -> int:
    if args.action == "put":
        path = Path(args.file)
        text = path.read_text()
        is_json = path.suffix == ".json"
        name = (json.loads(text) if is_json else _yaml_name(text)).get("name")
        if not isinstance(name, str):
            raise ValueError(f"{path}: name: is required")
        ctype = "application/json" if is_json else "application/yaml"
        client.call(
            "PUT", f"/v1/policies/{name}", content=text.encode(), headers={"content-type": ctype}
        )
        print(name)
        return 0
    if args.action == "ls":
        rows = [("NAME", "IMAGE", "SERVICES", "UPDATED BY")]
        for p in client.call("GET", "/v1/policies"):
            rows.append((p["name"], p["image"], ",".join(p["services"]) or "-", p["updated_by"]))
        table(rows)
        return 0
    if args.action == "show":
        sys.stdout.write(client.call("GET", f"/v1/policies/{args.name}")["source"])
        return 0
    client.call("DELETE", f"/v1/policies/{args.name}")
    return 0


def _yaml_name(text: str) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _service(client: Any, args: argparse.Namespace, table: Any) -> int:
    if args.action == "put":
        body = {
            "upstream": args.upstream,
            "auth": args.auth,
            "secrets": args.secrets,
            "header_name": args.header_name,
        }
        client.call("PUT", f"/v1/services/{args.name}", json=body)
        return 0
    if args.action == "ls":
        rows = [("NAME", "UPSTREAM", "AUTH", "SECRETS")]
        for s in client.call("GET", "/v1/services"):
            rows.append((s["name"], s["upstream"], s["auth"], ",".join(s["secrets"])))
        table(rows)
        return 0
    client.call("DELETE", f"/v1/services/{args.name}")
    return 0


def _model_endpoint(client: Any, args: argparse.Namespace, table: Any) -> int:
    path = f"/v1/model-endpoints/{getattr(args, 'name', '')}"
    if args.action == "put":
        body = {
            "base_url": args.base_url,
            "api_key_secret": args.api_key_secret,
            "models": [m.strip() for m in args.models.split(",") if m.strip()],
        }
        _print_registered(client.call("PUT", path, json=body))
        return 0
    if args.action == "confirm":
        _print_registered(client.call("POST", f"{path}/confirm"))
        return 0
    if args.action == "ls":
        rows = [("NAME", "BASE URL", "API KEY SECRET", "MODELS", "CONFIRMED")]
        for e in client.call("GET", "/v1/model-endpoints"):
            rows.append(
                (
                    e["name"],
                    e["base_url"],
                    e["api_key_secret"] or "-",
                    ",".join(e["models"]) or "any",
                    "yes" if e["confirmed"] else "NO",
                )
            )
        table(rows)
        return 0
    if args.action == "show":
        print(json.dumps(client.call("GET", path), indent=2))
        return 0
    client.call("DELETE", path)
    return 0


def _print_registered(endpoint: dict[str, Any]) -> None:
    """The endpoint's name, and what its host resolved to (what a run may reach)."""
    found = endpoint.get("resolved")
    if found is None:
        where = f"not resolved now ({endpoint.get('unresolved')})"
    else:
        where = ", ".join(f"{a['address']} ({a['address_class']})" for a in found)
    print(f"{endpoint['name']} {endpoint['base_url']}: {where}")


def _secret(client: Any, args: argparse.Namespace, table: Any) -> int:
    if args.action == "set":
        if sys.stdin is None or sys.stdin.isatty():
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


def _audit(args: argparse.Namespace, settings: Settings) -> int:
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
