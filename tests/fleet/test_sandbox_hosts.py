"""Sandboxes on fleet hosts, with a real control plane and real gVisor sandboxes: a create
is placed on the host (its capacity reserved, a `sandboxes` row naming host and epoch, both
given back on destroy); a draining host takes none (refused naming the rule, nothing boots);
a host whose heartbeat stops is marked lost, its sandboxes with it, and the run on it fails
with that reason; the host, heartbeating again, destroys what it ran and begins a new life."""

from __future__ import annotations

import asyncio
import json

from api_plane import booting_plane_settings, running_plane
from run_helpers import make_agent, wait_end
from scripted_model import ScriptedModelServerForTests
from sqlalchemy import text

LOST_SECONDS = 1.5
FAST_FLEET = {"AAMP_FLEET_HEARTBEAT_SECONDS": "0.25", "AAMP_FLEET_LOST_SECONDS": str(LOST_SECONDS)}


def _rows(cp, sql: str, **params) -> list:  # type: ignore[no-untyped-def]
    with cp.store.engine.connect() as conn:
        return list(conn.execute(text(sql), params).all())


async def test_a_sandbox_is_placed_on_its_host_and_gives_the_room_back(
    tmp_path, base_image
) -> None:
    async with running_plane(booting_plane_settings(tmp_path)) as plane:
        cp = plane.cp
        async with plane.client(plane.admin_token) as admin:
            made = await admin.post(
                "/v1/sandboxes", json={"resources": {"cpus": 0.5, "memory_bytes": 256 * 2**20}}
            )
            assert made.status_code == 201, made.text
            sb = made.json()["id"]
            assert made.json()["host"] == "local"
            host = cp.hosts.get("local")
            assert (host.used_sandboxes, host.used_cpus, host.used_memory_mb) == (1, 0.5, 256)
            assert _rows(
                cp, "SELECT host_id, host_epoch, state FROM sandboxes WHERE id = :i", i=sb
            ) == [("local", host.epoch, "live")]
            assert (await admin.delete(f"/v1/sandboxes/{sb}")).status_code == 204
        host = cp.hosts.get("local")
        assert (host.used_sandboxes, host.used_cpus, host.used_memory_mb) == (0, 0.0, 0)
        assert _rows(cp, "SELECT id FROM sandboxes") == []


async def test_a_draining_host_takes_no_new_sandbox(tmp_path, base_image) -> None:
    async with running_plane(booting_plane_settings(tmp_path)) as plane:
        cp = plane.cp
        async with plane.client(plane.admin_token) as admin:
            kept = await admin.post("/v1/sandboxes", json={})
            assert kept.status_code == 201, kept.text
            assert (await admin.post("/v1/hosts/local/drain")).status_code == 200
            refused = await admin.post("/v1/sandboxes", json={})
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "no_capacity"
            assert "no active host of local" in refused.json()["message"]
            # Nothing booted for it; the sandbox it already ran goes on until it ends.
            assert [s.id for s in cp.manager.list()] == [kept.json()["id"]]
            ran = await admin.post(
                f"/v1/sandboxes/{kept.json()['id']}/exec", json={"argv": ["true"]}
            )
            assert ran.status_code == 200
            assert cp.hosts.get("local").used_sandboxes == 1
            assert (await admin.delete(f"/v1/sandboxes/{kept.json()['id']}")).status_code == 204
        assert cp.hosts.get("local").used_sandboxes == 0


async def test_a_host_whose_heartbeat_stops_is_lost_with_its_sandboxes_and_runs(
    tmp_path, base_image
) -> None:
    turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 300"}}]}]
    settings = booting_plane_settings(tmp_path, **FAST_FLEET)
    async with running_plane(settings) as plane:
        cp = plane.cp
        with ScriptedModelServerForTests(turns) as model:
            async with plane.client(plane.admin_token) as admin:
                agent = await make_agent(
                    admin, "doomed", model.base_url, {"name": "p"}, tools=["shell"]
                )
                run_id = (await admin.post(f"/v1/agents/{agent}/runs", json={"task": "t"})).json()[
                    "id"
                ]
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 180
                while not any(e.type == "tool.call" for e in cp.runs.runs.events_after(run_id, 0)):
                    assert loop.time() < deadline
                    await asyncio.sleep(0.05)
                sandbox_id = (await admin.get(f"/v1/runs/{run_id}")).json()["sandbox_id"]
                epoch = cp.hosts.get("local").epoch
                local, cp.fleet.local = cp.fleet.local, None  # the host's heartbeat stops
                run = await wait_end(admin, run_id, timeout=30)
                lost_state = cp.hosts.get("local").state
                cp.fleet.local = local  # it heartbeats again: refused, so it begins again
                deadline = loop.time() + 30
                while cp.hosts.get("local").epoch == epoch:
                    assert loop.time() < deadline
                    await asyncio.sleep(0.05)
                again = cp.hosts.get("local")
        lost = _rows(cp, "SELECT reason, details FROM audit_records WHERE action = 'host.lost'")
    assert lost_state == "lost"
    assert run["status"] == "failed"
    assert run["reason"].startswith(f"sandbox: {sandbox_id} was lost: host local was lost")
    assert again.state == "active" and again.epoch == epoch + 1 and again.used_sandboxes == 0
    assert len(lost) == 1 and json.loads(lost[0][1]) == {"epoch": epoch}
