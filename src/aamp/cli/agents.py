"""`aamp agent create|edit|publish|ls` and `aamp approval ls|approve|deny`, over the API.

    aamp agent create -f agent.yaml        # name + definition; creates the agent and its draft
    aamp agent edit AGENT -f agent.yaml    # replaces the draft
    aamp agent publish AGENT               # freezes the draft as the next version
    aamp agent ls
    aamp approval ls [--all] | approve ID [--note TEXT] | deny ID [--note TEXT]

AGENT is an agent's id or name (`aamp.cli.refs`). The file is read here only to find the
agent's name and send the definition; the server checks it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aamp.cli.output import table
from aamp.cli.parsing import action, actions
from aamp.cli.refs import agent_id

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from typing import Any

    from aamp.client import Client


def agent_arguments(p: argparse.ArgumentParser) -> None:
    agent = actions(p)
    create = action(agent, "create", "create an agent from a YAML/JSON file (draft)")
    create.add_argument("-f", "--file", required=True, type=Path)
    edit = action(agent, "edit", "replace an agent's draft from a file", "agent")
    edit.add_argument("-f", "--file", required=True, type=Path)
    action(agent, "publish", "publish the draft as the next version", "agent")
    action(agent, "ls", "list agents and their newest versions")


def agent(client: Client, args: argparse.Namespace) -> int:
    if args.action == "create":
        data = _load(args.file)
        name = data.get("name")
        if not isinstance(name, str):
            raise ValueError(f"{args.file}: name: required (the agent's name)")
        made = client.call("POST", "/v1/agents", json={"name": name})
        try:
            draft = client.call("PUT", f"/v1/agents/{made['id']}/draft", json=data)
        except Exception:
            client.call("DELETE", f"/v1/agents/{made['id']}")  # nothing half-made remains
            raise
        print(f"{made['id']}  {name}  draft version {draft['version']}")
        return 0
    if args.action == "edit":
        ident = agent_id(client, args.agent)
        draft = client.call("PUT", f"/v1/agents/{ident}/draft", json=_load(args.file))
        print(f"{ident}  draft version {draft['version']} saved")
        return 0
    if args.action == "publish":
        ident = agent_id(client, args.agent)
        published = client.call("POST", f"/v1/agents/{ident}/publish")
        print(f"{ident}  version {published['version']} published")
        return 0
    rows = [("ID", "NAME", "OWNER", "VERSIONS")]
    for agent in client.call("GET", "/v1/agents"):
        versions = client.call("GET", f"/v1/agents/{agent['id']}/versions")
        listed = ",".join(
            f"{v['version']}{'*' if v['status'] == 'draft' else ''}" for v in versions
        )
        rows.append((agent["id"], agent["name"], agent["owner"], listed or "-"))
    table(rows)
    return 0


def _load(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with name, model, tools, policy, ...")
    return data


def approval_arguments(p: argparse.ArgumentParser) -> None:
    approval = actions(p)
    listed = action(approval, "ls", "the open questions you may answer")
    listed.add_argument("--all", action="store_true", help="answered ones too")
    listed.add_argument("--run", metavar="RUN", help="only the questions of this run")
    for verb in ("approve", "deny"):
        answer = action(approval, verb, f"{verb} a question; the run goes on", "id")
        answer.add_argument("--note", help="why (kept in the audit log, shown to the run)")


def approval(client: Client, args: argparse.Namespace) -> int:
    if args.action == "ls":
        params = {"pending": "false"} if args.all else {}
        if args.run:
            params["run_id"] = args.run
        rows = [("ID", "RUN", "KIND", "SUBJECT", "STATUS", "BY", "REQUESTED")]
        for item in client.call("GET", "/v1/approvals", params=params):
            subject = item["subject"]
            if item["kind"] == "egress":
                what = f"{subject.get('host')}:{subject.get('port')}"
            else:
                what = f"{subject.get('name')} ({subject.get('size')} bytes)"
            rows.append(
                (
                    item["id"],
                    item["run_id"],
                    item["kind"],
                    what,
                    item["status"],
                    item.get("decided_by") or "-",
                    item["requested_at"],
                )
            )
        table(rows)
        return 0
    body = {"decision": args.action, "note": args.note}
    decided = client.call("POST", f"/v1/approvals/{args.id}", json=body)
    print(f"approval {decided['id']} {decided['status']} (run {decided['run_id']})")
    return 0
