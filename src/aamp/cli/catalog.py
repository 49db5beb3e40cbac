"""`aamp policy|service|model-endpoint`: what admins register for agents to be granted
(policies from YAML or JSON files, services with their credentials' secret names, model
endpoints), over the API."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from aamp.cli.output import table
from aamp.cli.parsing import action, actions

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from typing import Any

    from aamp.client import Client


def policy_arguments(p: argparse.ArgumentParser) -> None:
    policy = actions(p)
    action(policy, "put", "create or replace a policy from a YAML or JSON file", "file")
    action(policy, "ls", "list policies")
    action(policy, "show", "print a policy's document", "name")
    action(policy, "rm", "delete a policy", "name")


def service_arguments(p: argparse.ArgumentParser) -> None:
    service = actions(p)
    sp = action(service, "put", "define a service", "name")
    sp.add_argument("--upstream", required=True)
    sp.add_argument("--auth", required=True, choices=["bearer", "basic", "header"])
    sp.add_argument("--secret", action="append", default=[], dest="secrets")
    sp.add_argument("--header-name")
    action(service, "ls", "list services")
    action(service, "rm", "delete a service", "name")


def model_endpoint_arguments(p: argparse.ArgumentParser) -> None:
    endpoint = actions(p)
    ep = action(endpoint, "put", "register (or replace) a model endpoint", "name")
    ep.add_argument("--base-url", required=True, help="e.g. http://llm.internal:8080/v1")
    ep.add_argument("--api-key-secret", help="the vault secret holding its API key")
    ep.add_argument("--models", default="", help="the model names it serves: a,b (none: any)")
    action(endpoint, "ls", "list model endpoints")
    action(endpoint, "show", "print a model endpoint", "name")
    action(endpoint, "confirm", "confirm an endpoint migration 0005 made", "name")
    action(endpoint, "rm", "delete a model endpoint", "name")


def policy(client: Client, args: argparse.Namespace) -> int:
    if args.action == "put":
        path = Path(args.file)
        text = path.read_text()
        is_json = path.suffix == ".json"
        name = (json.loads(text) if is_json else _yaml_name(text)).get("name")
        if not isinstance(name, str):
            raise ValueError(f"{path}: name: is required")
        ctype = "application/json" if is_json else "application/yaml"
        client.call(
            "PUT",
            f"/v1/policies/{name}",
            content=text.encode(),
            headers={"content-type": ctype},
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
    """The document as a mapping, only to find its name; the server parses and checks it."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def service(client: Client, args: argparse.Namespace) -> int:
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


def model_endpoint(client: Client, args: argparse.Namespace) -> int:
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
