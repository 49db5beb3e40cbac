"""Two control-plane replicas (two processes, real gVisor) on one real PostgreSQL database:
any replica serves a run that the other drives. An SSE client on B sees the steps A writes,
and reconnects to A with `Last-Event-ID` losing nothing; an approval answered on B wakes the
run waiting on A; a cancel sent to B stops the run A drives. A SIGTERM of the driving replica
hands its run over: the other one goes on with it at once, not after the lease expired."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from run_helpers import free_port, make_agent, parse_sse, serve_plane, wait_end
from scripted_model import ScriptedModelServerForTests

from aamp.sandbox import procs

POLICY = {
    "name": "asks",
    "image": "base",
    "egress": {"default": "block"},
    "data": {"outbound": {"max_bytes": "1MB", "types": ["txt"], "approval": True}},
}


def _shell(command: str) -> dict:
    return {"name": "shell", "arguments": {"command": command}}


@contextmanager
def _replicas(
    tmp_path: Path, postgres_server: Any, lease_seconds: int
) -> Iterator[tuple[list[subprocess.Popen[bytes]], list[int], Path]]:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("the control plane needs root and runsc here")
    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")
    env = {
        "AAMP_DATABASE_URL": url.render_as_string(hide_password=False),
        "AAMP_RUN_LEASE_SECONDS": str(lease_seconds),
    }
    home = tmp_path / "home"  # shared: the vault key, the audit signing key and witness
    runtimes = [f"/run/aamp-t{secrets.token_hex(4)}" for _ in range(2)]
    ports = [free_port(), free_port()]
    planes: list[subprocess.Popen[bytes]] = []
    try:
        for name, runtime, port in zip("ab", runtimes, ports, strict=True):
            planes.append(
                serve_plane(home, runtime, port, AAMP_FLEET_HOST_ID=f"host-{name}", **env)
            )
        yield planes, ports, home
    finally:
        for proc in planes:
            proc.kill()
            proc.wait()
        leftover = [procs.pids_matching(f"--root={r}/runsc") for r in runtimes]
        for r in runtimes:
            shutil.rmtree(r, ignore_errors=True)
        assert leftover == [[], []]


@asynccontextmanager
async def _clients(ports: list[int], home: Path) -> AsyncIterator[list[httpx.AsyncClient]]:
    token = (home / "cli-token").read_text().strip()
    h = {"authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[0]}", headers=h, timeout=90) as a,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[1]}", headers=h, timeout=90) as b,
    ):
        yield [a, b]


async def _follow(
    client: httpx.AsyncClient, run_id: str, until: str, last_id: int | None = None
) -> list[dict]:
    """The run's SSE stream on `client` (from after `last_id`) until a step of type `until`."""
    headers = {"last-event-id": str(last_id)} if last_id is not None else {}
    buffer, seen = "", []
    async with client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as stream:
        async for chunk in stream.aiter_text():
            buffer += chunk
            seen = parse_sse(buffer.rsplit("\n\n", 1)[0] + "\n\n")
            if any(e["event"] == until for e in seen):
                return seen
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    raise AssertionError(f"the stream ended before {until}: {seen}; the run: {run}")


async def _steps(client: httpx.AsyncClient, run_id: str) -> list[dict]:
    return parse_sse((await client.get(f"/v1/runs/{run_id}/events")).text)


async def test_a_run_driven_by_one_replica_is_followed_answered_and_cancelled_on_the_other(
    tmp_path: Path, base_image, postgres_server
) -> None:
    turns = [
        {"tool_calls": [_shell("echo one")]},
        {"tool_calls": [_shell("echo hi > out/report.txt")]},
        {"content": "done"},
        # The second run, cancelled while its command runs.
        {"tool_calls": [_shell("sleep 300")]},
    ]
    with (
        _replicas(tmp_path, postgres_server, 6) as (_, ports, home),
        ScriptedModelServerForTests(turns) as model,
    ):
        async with _clients(ports, home) as (ca, cb):
            agent = await make_agent(
                ca, "replicas", model.base_url, POLICY, limits={"approval_timeout": "3m"}
            )
            made = await ca.post(f"/v1/agents/{agent}/runs", json={"task": "t"})
            assert made.status_code == 201, made.text
            run_id = made.json()["id"]  # A made it, so A drives it

            # B's stream shows A's steps as they are stored, up to the question.
            first = await asyncio.wait_for(_follow(cb, run_id, "approval.requested"), 120)
            asked = first[-1]["data"]["approval"]
            assert (await cb.get(f"/v1/runs/{run_id}")).json()["status"] == "waiting_approval"
            answered = await cb.post(f"/v1/approvals/{asked}", json={"decision": "approve"})
            assert answered.status_code == 200, answered.text
            # Reconnect to A from the last step B's stream showed: the rest, nothing twice.
            rest = await asyncio.wait_for(
                _follow(ca, run_id, "run.finished", last_id=first[-1]["id"]), 60
            )
            run = await wait_end(cb, run_id, timeout=30)
            stored = await _steps(cb, run_id)
            artifacts = (await cb.get(f"/v1/runs/{run_id}/artifacts")).json()

            second = (await ca.post(f"/v1/agents/{agent}/runs", json={"task": "t"})).json()["id"]
            await asyncio.wait_for(_follow(cb, second, "tool.call"), 120)
            cancelled = await cb.post(f"/v1/runs/{second}/cancel")
            assert cancelled.status_code == 200, cancelled.text
            second_steps = await _steps(ca, second)
            second_run = (await ca.get(f"/v1/runs/{second}")).json()

    assert run["status"] == "succeeded" and run["answer"] == "done", run
    assert [a["name"] for a in artifacts] == ["report.txt"]
    assert first + rest == stored
    assert [e["id"] for e in stored] == list(range(1, len(stored) + 1))
    decided = [e["data"] for e in stored if e["event"] == "approval.decided"]
    assert decided == [{"approval": asked, "status": "approved", "by": "user:admin", "note": None}]
    # The cancel's answer is the run as it ended on A, which B asked through the run's row.
    assert cancelled.json()["status"] == "cancelled", cancelled.json()
    assert cancelled.json()["reason"] == "cancelled by user:admin"
    assert second_run["status"] == "cancelled"
    assert second_steps[-1]["event"] == "run.finished"
    assert second_steps[-1]["data"]["status"] == "cancelled"
    assert [e["event"] for e in second_steps].count("tool.result") == 0


async def test_sigterm_of_the_driving_replica_hands_its_run_to_the_other(
    tmp_path: Path, base_image, postgres_server
) -> None:
    lease = 45  # a takeover only at expiry, or at the other's next beat, comes 15 s or more late
    turns = [
        {"tool_calls": [_shell("echo one")]},
        # Replica A shuts down while it waits for this answer, which it never gets.
        {"sleep": 8, "tool_calls": [_shell("echo never-run")]},
        {"tool_calls": [_shell("echo two")]},
        {"content": "done"},
    ]
    with (
        _replicas(tmp_path, postgres_server, lease) as (planes, ports, home),
        ScriptedModelServerForTests(turns) as model,
    ):
        async with _clients(ports, home) as (ca, cb):
            agent = await make_agent(ca, "handoff", model.base_url, {**POLICY, "name": "p2"})
            run_id = (await ca.post(f"/v1/agents/{agent}/runs", json={"task": "t"})).json()["id"]
            await asyncio.wait_for(_follow(cb, run_id, "tool.result"), 120)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while len(model.requests) < 2:  # A waits for the model
                assert loop.time() < deadline
                await asyncio.sleep(0.05)
            planes[0].send_signal(signal.SIGTERM)
            await asyncio.to_thread(planes[0].wait, 60)
            stopped = time.monotonic()
            resumed = await asyncio.wait_for(_follow(cb, run_id, "run.resumed"), 60)
            handed_over_after = time.monotonic() - stopped
            run = await wait_end(cb, run_id, timeout=120)
            steps = await _steps(cb, run_id)

    # A clean shutdown (uvicorn raises the signal again once it has shut down).
    assert planes[0].returncode in (0, -signal.SIGTERM)
    assert run["status"] == "succeeded" and run["answer"] == "done", run
    assert handed_over_after < lease / 3 - 5, handed_over_after
    types = [e["event"] for e in steps]
    assert [e["id"] for e in steps] == list(range(1, len(steps) + 1))
    assert types.count("run.handed_off") == 1 and types.count("run.finished") == 1
    at = types.index("run.handed_off")
    assert types[at + 1] == "run.resumed" and resumed[-1] == steps[at + 1]
    assert steps[at]["data"]["by"] == steps[at + 1]["data"]["from"]
    assert steps[at]["data"]["reason"] == "the control plane shut down during the run"
    assert [e["data"]["step"] for e in steps if e["event"] == "model.call"] == [1, 2, 3]
