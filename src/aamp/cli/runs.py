"""`aamp run ...`: start an agent's run and follow its steps, or look at runs, over the API.

    aamp run AGENT "task" [--input FILE ...] [--version N|latest|draft] [--download DIR]
    aamp run AGENT "task" ... --no-follow  # prints only the run's id, for scripts
    aamp run ls | show RUN | cancel RUN | artifacts RUN [--download DIR]

AGENT is an agent's id or name (`aamp.cli.refs`). `aamp run AGENT ...` streams the steps and
exits 0 when the run succeeds, 1 if it ends any other way; with `--download DIR` it then saves
the run's artifacts into DIR (see `aamp.cli.download`), and a failed download exits 1 as well.
Ctrl-C stops following (the run goes on; `aamp run cancel` stops it, `aamp run artifacts RUN
--download DIR` fetches its files later). An option that does not apply to the command given
is refused.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

from aamp.cli.output import shown, table
from aamp.cli.refs import agent_id

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from typing import Any

    from aamp.client import Client

RUN_ACTIONS = ("ls", "show", "cancel", "artifacts")
# Which of `aamp run`'s options each form takes ("start" is `aamp run AGENT TASK`).
RUN_OPTIONS = {
    "start": {"input", "version", "download", "no_follow"},
    "artifacts": {"download"},
    "ls": set(),
    "show": set(),
    "cancel": set(),
}


def run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("words", nargs="+", metavar="AGENT TASK | ls | show RUN | ...")
    p.add_argument("--input", action="append", default=[], type=Path, metavar="FILE")
    p.add_argument("--version", help="a version number, latest (the default) or draft")
    p.add_argument(
        "--download",
        type=Path,
        metavar="DIR",
        help="save the run's artifacts into DIR when it ends (with `run artifacts RUN`: now)",
    )
    p.add_argument("--no-follow", action="store_true", help="start the run and print only its id")


def run(client: Client, args: argparse.Namespace) -> int:
    words = args.words
    is_action = words[0] in RUN_ACTIONS and not (words[0] == "ls" and len(words) > 1)
    _refuse_options_that_do_not_apply(args, words[0] if is_action else "start")
    if is_action:
        return _run_action(client, words, args)
    if len(words) != 2:
        raise ValueError('usage: aamp run AGENT "task" [--input FILE ...]')
    if args.download is not None:
        if args.no_follow:
            raise ValueError("--download waits for the run to end; it cannot go with --no-follow")
        from aamp.cli.download import check_directory  # loaded only by a run that saves files

        check_directory(args.download)  # before the run starts, not after it ended
    ident = agent_id(client, words[0])
    inputs = [
        {"name": p.name, "content_b64": base64.b64encode(p.read_bytes()).decode()}
        for p in args.input
    ]
    wanted = args.version or "latest"
    version: int | str = int(wanted) if wanted.isdigit() else wanted
    run = client.call(
        "POST",
        f"/v1/agents/{ident}/runs",
        json={"task": words[1], "inputs": inputs, "version": version},
    )
    if args.no_follow:
        print(run["id"])  # nothing else on stdout: `id=$(aamp run ... --no-follow)`
        return 0
    print(f"run {run['id']} ({run['status']}, version {run['version']})", flush=True)
    status = follow(client, run["id"])
    if args.download is not None:
        _download(client, run["id"], args.download)
    return 0 if status == "succeeded" else 1


def _refuse_options_that_do_not_apply(args: argparse.Namespace, form: str) -> None:
    given = {
        "input": bool(args.input),
        "version": args.version is not None,
        "download": args.download is not None,
        "no_follow": args.no_follow,
    }
    for option, present in given.items():
        if present and option not in RUN_OPTIONS[form]:
            flag = "--" + option.replace("_", "-")
            where = "aamp run AGENT TASK" if form == "start" else f"aamp run {form}"
            takes = sorted("--" + o.replace("_", "-") for o in RUN_OPTIONS[form])
            raise ValueError(
                f"{flag} does not apply to `{where}` (it takes {', '.join(takes) or 'no options'})"
            )


def _download(client: Client, run_id: str, dest: Path) -> None:
    from aamp.cli.download import save_artifacts

    items = client.call("GET", f"/v1/runs/{run_id}/artifacts")
    save_artifacts(
        client, run_id, items, dest, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )


def follow(client: Client, run_id: str) -> str:
    """Print the run's steps as they happen; returns the status it ended with. (The SDK's
    `Run.events` resumes after the last step shown when the stream breaks off.)"""
    from aamp.client import Run

    run = Run(client, {"id": run_id, "status": "unknown"})
    for event in run.events():
        print(describe(event.type, event.data), flush=True)
    return run.status


def describe(kind: str, d: dict[str, Any]) -> str:
    """One line per step, for people (a terminal: what a guest or model wrote is `shown`)."""
    return shown(_step_line(kind, d))


def _step_line(kind: str, d: dict[str, Any]) -> str:
    if kind == "model.call":
        calls = ", ".join(c["name"] for c in d.get("tool_calls", [])) or "final answer"
        return (
            f"[{d.get('step')}] model: {calls} ({d.get('prompt_tokens')}+"
            f"{d.get('completion_tokens')} tokens, {d.get('seconds', 0):.2f} s)"
        )
    if kind == "tool.call":
        return f"    → {d.get('name')} {_short(d.get('arguments', ''), 200)}"
    if kind == "tool.result":
        mark = "ok" if d.get("ok") else "error"
        return f"    ← {mark}: {_short(d.get('text', ''), 400)}"
    if kind == "screenshot":
        return f"    screenshot {d.get('sha256', '')[:12]}"
    if kind == "artifact":
        return f"artifact {d.get('name')} ({d.get('size')} bytes, sha256 {d.get('sha256')})"
    if kind == "approval.requested":
        return (
            f"waiting for approval {d.get('approval')} ({d.get('kind')}: "
            f"{json.dumps(d.get('subject'))}); answer: aamp approval approve|deny "
            f"{d.get('approval')}"
        )
    if kind == "run.finished":
        tail = f": {d.get('reason')}" if d.get("reason") else ""
        answer = f"\n{d.get('answer')}" if d.get("answer") else ""
        return f"run {d.get('status')}{tail}{answer}"
    return f"{kind} {_short(json.dumps(d), 300)}"


def _short(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _run_action(client: Client, words: list[str], args: argparse.Namespace) -> int:
    action = words[0]
    if action == "ls":
        rows = [("ID", "AGENT", "VERSION", "OWNER", "STATUS", "STEPS", "CREATED")]
        for run in client.call("GET", "/v1/runs"):
            rows.append(
                (
                    run["id"],
                    run["agent_id"],
                    str(run["version"]),
                    run["owner"],
                    run["status"],
                    str(run["steps"]),
                    run["created_at"],
                )
            )
        table(rows)
        return 0
    if len(words) != 2:
        raise ValueError(f"usage: aamp run {action} RUN")
    run_id = words[1]
    if action == "show":
        print(json.dumps(client.call("GET", f"/v1/runs/{run_id}"), indent=2))
        return 0
    if action == "cancel":
        run = client.call("POST", f"/v1/runs/{run_id}/cancel")
        print(f"run {run_id} {run['status']}: {run['reason']}")
        return 0
    items = client.call("GET", f"/v1/runs/{run_id}/artifacts")
    table([("NAME", "SIZE", "SHA256")] + [(a["name"], str(a["size"]), a["sha256"]) for a in items])
    if args.download is not None:
        _download(client, run_id, args.download)
    return 0
