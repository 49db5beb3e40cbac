"""A replica whose run another replica took over (it stalled past its lease) stops driving
it and writes nothing more into it — no step, no status, no ending — and destroys its own
sandbox of it. Real gVisor sandbox, the scripted model double; the other replica is a
second `RunLeases` on the same store claiming the run as a replica's sweep does."""

from __future__ import annotations

import asyncio
import time

from run_helpers import make_agent
from scripted_model import ScriptedModelServerForTests

from aamp.runs.leases import RunLeases


async def test_a_run_taken_over_is_dropped_here_without_a_write(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    service = cp.runs
    assert service is not None
    turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 300"}}]}]
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(
                admin, "stalled", model.base_url, {"name": "p"}, tools=["shell"]
            )
            run_id = (await admin.post(f"/v1/agents/{agent}/runs", json={"task": "t"})).json()["id"]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 180
            while not any(e.type == "tool.call" for e in service.runs.events_after(run_id, 0)):
                assert loop.time() < deadline
                await asyncio.sleep(0.05)
            before = service.runs.events_after(run_id, 0)
            # Another replica, whose clock says this one's lease has long expired, claims it.
            other = RunLeases(
                cp.store, "replica-other", seconds=60, clock=lambda: time.time() + 3600
            )
            assert other.claim_expired() == (run_id, service.replica)
            assert await service.sweep_leases() == []  # renewal: lost; nothing to claim
            await asyncio.wait_for(service.wait(run_id), 60)
    run = service.runs.get(run_id)
    assert run.status == "running" and run.ended_at is None  # the new driver's to end
    assert service.runs.events_after(run_id, 0) == before  # not one step more
    assert not service.live(run_id) and cp.manager.list() == []
    assert service.leases.fence(run_id) is None and other.fence(run_id) is not None


async def test_a_shutdown_on_sqlite_fails_the_run_as_before(run_plane) -> None:
    """One host with SQLite: no other replica can take the run, so a clean shutdown fails
    it with the reason (no hand-off), and the next start has nothing to take over."""
    plane, cp = run_plane, run_plane.cp
    service = cp.runs
    assert service is not None and cp.store.dialect == "sqlite"
    turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 300"}}]}]
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(admin, "stops", model.base_url, {"name": "p"}, tools=["shell"])
            run_id = (await admin.post(f"/v1/agents/{agent}/runs", json={"task": "t"})).json()["id"]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 180
            while not any(e.type == "tool.call" for e in service.runs.events_after(run_id, 0)):
                assert loop.time() < deadline
                await asyncio.sleep(0.05)
            await asyncio.wait_for(service.shutdown(), 60)
    run = service.runs.get(run_id)
    assert run.status == "failed" and run.reason == "the control plane shut down during the run"
    types = [e.type for e in service.runs.events_after(run_id, 0)]
    assert "run.handed_off" not in types and types[-1] == "run.finished"
    assert service.runs.interrupted() == [] and cp.manager.list() == []
