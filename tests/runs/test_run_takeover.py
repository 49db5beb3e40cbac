"""Two control-plane replicas on one real PostgreSQL database; `kill -9` of the replica driving
a run while it waits for the model: the other replica takes the run over once its lease
expired and finishes it from the step log — every step once, numbered on with no gap, the
tool call already made not made again, the model told its sandbox is fresh — and the audit
chain verifies. The killed replica, started again, fails no run and leaves no sandbox."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from run_helpers import free_port, make_agent, parse_sse, serve_plane, wait_end
from scripted_model import ScriptedModelServerForTests

from aamp.runs.replica import FRESH_SANDBOX_NOTE
from aamp.sandbox import procs

LEASE_SECONDS = "3"


def _shell(command: str) -> dict:
    return {"name": "shell", "arguments": {"command": command}}


async def _until(predicate, timeout: float = 180) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_kill_9_of_the_driving_replica_the_other_finishes_the_run(
    tmp_path: Path, base_image, postgres_server
) -> None:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("the control plane needs root and runsc here")
    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")
    env = {
        "AAMP_DATABASE_URL": url.render_as_string(hide_password=False),
        "AAMP_RUN_LEASE_SECONDS": LEASE_SECONDS,
    }
    home = tmp_path / "home"  # shared: the vault key, the audit signing key and witness
    runtime_a, runtime_b = (f"/run/aamp-t{secrets.token_hex(4)}" for _ in range(2))
    port_a, port_b = free_port(), free_port()
    turns = [
        {"tool_calls": [_shell("echo one")]},
        # Replica A is killed while it waits for this answer, which it never gets.
        {"sleep": 8, "tool_calls": [_shell("echo never-run")]},
        {"tool_calls": [_shell("echo two")]},
        {"content": "done"},
    ]
    procs_: list[subprocess.Popen[bytes]] = []
    try:
        a = serve_plane(home, runtime_a, port_a, AAMP_FLEET_HOST_ID="host-a", **env)
        procs_.append(a)
        b = serve_plane(home, runtime_b, port_b, AAMP_FLEET_HOST_ID="host-b", **env)
        procs_.append(b)
        token = (home / "cli-token").read_text().strip()
        h = {"authorization": f"Bearer {token}"}
        with ScriptedModelServerForTests(turns) as model:
            async with (
                httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port_a}", headers=h, timeout=60
                ) as ca,
                httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port_b}", headers=h, timeout=60
                ) as cb,
            ):
                agent = await make_agent(
                    ca, "takeover", model.base_url, {"name": "p"}, tools=["shell"]
                )
                made = await ca.post(f"/v1/agents/{agent}/runs", json={"task": "t"})
                assert made.status_code == 201, made.text
                run_id = made.json()["id"]
                seen: list[dict] = []
                buffer = ""
                async with ca.stream("GET", f"/v1/runs/{run_id}/events") as stream:
                    async for chunk in stream.aiter_text():
                        buffer += chunk
                        seen = parse_sse(buffer.rsplit("\n\n", 1)[0] + "\n\n")
                        if any(e["event"] == "tool.result" for e in seen):
                            break
                await _until(lambda: len(model.requests) == 2)  # A waits for the model
                first_sandbox = (await cb.get(f"/v1/runs/{run_id}")).json()["sandbox_id"]
                os.kill(a.pid, signal.SIGKILL)
                a.wait(timeout=30)

                run = await wait_end(cb, run_id, timeout=120)
                after = parse_sse((await cb.get(f"/v1/runs/{run_id}/events")).text)
                verified = (await cb.get("/v1/audit/verify")).json()

                # A again, on its own runtime directory: it reaps what it left, fails nothing.
                a = serve_plane(home, runtime_a, port_a, AAMP_FLEET_HOST_ID="host-a", **env)
                procs_.append(a)
                again = (await cb.get(f"/v1/runs/{run_id}")).json()
    finally:
        for proc in procs_:
            proc.kill()
            proc.wait()
        leftover = [procs.pids_matching(f"--root={r}/runsc") for r in (runtime_a, runtime_b)]
        for r in (runtime_a, runtime_b):
            shutil.rmtree(r, ignore_errors=True)

    assert run["status"] == "succeeded", run
    assert run["answer"] == "done"
    assert again["status"] == "succeeded" and again["ended_at"] == run["ended_at"]
    assert verified["ok"], verified
    # Every step once: what A streamed is kept, numbered on with no gap and no repeat.
    assert after[: len(seen)] == seen
    assert [e["id"] for e in after] == list(range(1, len(after) + 1))
    types = [e["event"] for e in after]
    assert types.count("run.resumed") == 1 and types.count("run.finished") == 1
    resumed = after[types.index("run.resumed")]
    assert resumed["data"]["after_seq"] == resumed["id"] - 1
    assert resumed["data"]["from"] != resumed["data"]["by"]
    assert resumed["data"]["from"].startswith("replica-")
    assert [e["data"]["step"] for e in after if e["event"] == "model.call"] == [1, 2, 3]
    commands = [json.loads(e["data"]["arguments"]) for e in after if e["event"] == "tool.call"]
    assert commands == [{"command": "echo one"}, {"command": "echo two"}]
    # B's sandbox is a fresh one, and the model was told so, after the first result.
    sandboxes = [e["data"]["sandbox"] for e in after if e["event"] == "sandbox.created"]
    assert len(sandboxes) == 2 and sandboxes[0] == first_sandbox != sandboxes[1]
    third = model.requests[2]["messages"]
    assert third[-1] == {"role": "user", "content": FRESH_SANDBOX_NOTE}
    assert any(m.get("role") == "tool" and "one" in m.get("content", "") for m in third)
    assert leftover == [[], []]
