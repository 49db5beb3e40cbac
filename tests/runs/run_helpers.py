"""Helpers shared by the run tests: define an agent with a policy through the API, wait for a
run's end, read its SSE stream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx


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
    """An agent whose definition uses `policy` (created and granted to it), published."""
    agent = (await admin.post("/v1/agents", json={"name": name})).json()["id"]
    r = await admin.put(f"/v1/policies/{policy['name']}", json=policy)
    assert r.status_code == 200, r.text
    for kind, item in (("policy", policy["name"]), ("image", policy.get("image", "base"))):
        r = await admin.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": item})
        assert r.status_code == 201, r.text
    definition = {
        "model": {"base_url": base_url, "name": "scripted", "timeout": "20s", "retries": 2},
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
