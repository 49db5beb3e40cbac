"""Helpers shared by the run tests: define an agent with a policy and a model endpoint through
the API, wait for a run's end, read its SSE stream; run a probe script in a network namespace
of its own, and give it an admin client of its in-process control plane."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
PLANE_CHILD = Path(__file__).with_name("serve_runs_plane.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_plane(home: Path, runtime: str, port: int, **env: str) -> subprocess.Popen[bytes]:
    """A real control plane as a child process (`serve_runs_plane.py`: gVisor, the built
    images), serving on `port` once this returns; `env` adds AAMP_* settings."""
    from install_layout import shared_image_dir  # tests/install_layout.py

    images = str(shared_image_dir())
    proc = subprocess.Popen(
        [sys.executable, str(PLANE_CHILD), str(home), runtime, images, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    deadline = time.monotonic() + 240  # a start takes 100 s and more under the load of CI
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health").status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)


def probe_in_netns(probe: Path, tmp_path: Path, *args: str, timeout: int = 500) -> dict:
    """Run `probe` under `unshare -n` with the settings of a fresh installation in `tmp_path`
    (and the tests' admin password); returns the JSON report it prints last."""
    from netns_probe_run import run_probe  # tests/netns_probe_run.py

    return run_probe(
        probe,
        tmp_path / "home",
        list(args),
        timeout=timeout,
        AAMP_ADMIN_PASSWORD="admin-password-for-tests",
    )


def admin_client(app: Any, token: str) -> httpx.AsyncClient:
    """A client of an in-process control plane's API, as the holder of `token`."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://aamp",
        headers={"authorization": f"Bearer {token}"},
        timeout=300,
    )


async def make_agent(
    admin: httpx.AsyncClient,
    name: str,
    base_url: str,
    policy: dict[str, Any],
    *,
    tools: list[str] | None = None,
    limits: dict[str, Any] | None = None,
    publish: bool = True,
) -> str:
    """An agent whose definition uses `policy` and a model endpoint at `base_url` (named
    `llm-NAME`; both registered and granted to it), published."""
    agent = (await admin.post("/v1/agents", json={"name": name})).json()["id"]
    r = await admin.put(f"/v1/policies/{policy['name']}", json=policy)
    assert r.status_code == 200, r.text
    endpoint = await put_endpoint(admin, f"llm-{name}", base_url)
    for kind, item in (
        ("policy", policy["name"]),
        ("image", policy.get("image", "base")),
        ("model-endpoint", endpoint),
    ):
        r = await admin.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": item})
        assert r.status_code == 201, r.text
    definition = {
        "model": {"endpoint": endpoint, "name": "scripted", "timeout": "20s", "retries": 2},
        "system_prompt": "You are a test agent.",
        "tools": tools or ["shell", "python", "files"],
        "policy": policy["name"],
        "limits": {"max_steps": 10, "wall_time": "3m", "tool_timeout": "60s", **(limits or {})},
    }
    r = await admin.put(f"/v1/agents/{agent}/draft", json=definition)
    assert r.status_code == 200, r.text
    if publish:
        r = await admin.post(f"/v1/agents/{agent}/publish")
        assert r.status_code == 200, r.text
    return agent


async def put_endpoint(admin: httpx.AsyncClient, name: str, base_url: str, **extra: Any) -> str:
    """Register model endpoint `name` at `base_url` (serving `scripted`); returns its name."""
    body = {"base_url": base_url, "models": ["scripted"], **extra}
    r = await admin.put(f"/v1/model-endpoints/{name}", json=body)
    assert r.status_code == 200, r.text
    return name


async def wait_end(client: httpx.AsyncClient, run_id: str, timeout: float = 240) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        run = (await client.get(f"/v1/runs/{run_id}")).json()
        if run["status"] in ("succeeded", "failed", "cancelled", "timed_out"):
            return run
        assert loop.time() < deadline, f"run {run_id} did not end: {run}"
        await asyncio.sleep(0.2)


def parse_sse(text: str) -> list[dict[str, Any]]:
    """SSE text -> [{id, event, data}] (comments skipped)."""
    events = []
    for block in text.split("\n\n"):
        item: dict[str, Any] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            item[key] = value.lstrip(" ")
        if "event" in item:
            item["id"] = int(item["id"])
            item["data"] = json.loads(item["data"])
            events.append(item)
    return events


def audit_and_tool_messages(store: Any, model: Any) -> dict[str, list]:
    """A finished probe's audit log (every record, in order) and the tool messages of the
    model's last request; closes the store."""
    from sqlalchemy import text

    with store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT actor, action, decision, reason, details FROM audit_records ORDER BY seq")
        ).all()
    store.close()
    return {
        "audit": [
            {"actor": a, "action": b, "decision": d, "reason": r, "details": json.loads(x)}
            for a, b, d, r, x in rows
        ],
        "tool_messages": [
            m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"
        ],
    }
