"""A run says whether its sandbox came warm: with `AAMP_WARM_POOL_LEARN`, the first run of a
policy boots cold and teaches the manager its boot key; the next run of it is handed a warm
sandbox from that pool. A stored policy with `warm: N` has its pool filled before any run
(real gVisor sandboxes, the scripted model double)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from api_plane import booting_plane_settings, running_plane
from run_helpers import make_agent, parse_sse, wait_end
from scripted_model import ScriptedModelServerForTests

POLICY = {
    "name": "small-box",
    "image": "base",
    "resources": {"pids": 128},  # not the default resources: no configured pool has them
    "lifetime": {"ttl": "10m", "idle": "5m"},
}


async def run_sandbox_events(admin, agent: str) -> dict:
    made = await admin.post(f"/v1/agents/{agent}/runs", json={"task": "go"})
    assert made.status_code == 201, made.text
    run = await wait_end(admin, made.json()["id"])
    assert run["status"] == "succeeded", run
    events = parse_sse((await admin.get(f"/v1/runs/{run['id']}/events")).text)
    [created] = [e for e in events if e["event"] == "sandbox.created"]
    return created["data"]


async def wait_pool(plane, size: int) -> None:
    deadline = time.monotonic() + 60
    while sum(plane.cp.manager.pool_status().values()) < size:
        assert time.monotonic() < deadline, plane.cp.manager.pool_status()
        await asyncio.sleep(0.1)


async def test_the_second_run_of_a_policy_gets_a_warm_sandbox(tmp_path: Path, base_image) -> None:
    settings = booting_plane_settings(tmp_path, AAMP_WARM_POOL_LEARN="1")
    async with running_plane(settings) as plane:
        turns = [{"content": "first"}, {"content": "second"}]
        with ScriptedModelServerForTests(turns) as model:
            async with plane.client(plane.admin_token) as admin:
                agent = await make_agent(admin, "warmed", model.base_url, POLICY)
                assert (await run_sandbox_events(admin, agent))["warm"] is False
                await wait_pool(plane, 1)  # the pool fills behind the first run
                assert (await run_sandbox_events(admin, agent))["warm"] is True


async def test_a_policy_with_warm_has_its_first_run_warm(tmp_path: Path, base_image) -> None:
    """No learning: `warm: 1` fills the pool when the policy is written, so even its first
    run's sandbox comes warm; a policy written again without it drains the pool, and the
    policies' counts are kept within AAMP_WARM_POOL_MAX (refused naming `warm`)."""
    settings = booting_plane_settings(tmp_path, AAMP_WARM_POOL_MAX="1")
    policy = {**POLICY, "name": "warm-box", "warm": 1}
    async with running_plane(settings) as plane:
        with ScriptedModelServerForTests([{"content": "one"}, {"content": "two"}]) as model:
            async with plane.client(plane.admin_token) as admin:
                agent = await make_agent(admin, "prewarmed", model.base_url, policy)
                assert (await admin.get("/v1/policies/warm-box")).json()["warm"] == 1
                other = {**POLICY, "name": "other", "warm": 1}
                over = await admin.put("/v1/policies/other", json=other)
                assert over.status_code == 400, over.text
                assert "warm: 2 sandboxes would be kept warm" in over.json()["message"]
                inline = await admin.post(
                    "/v1/sandboxes", json={"policy_document": "name: inline\nwarm: 1\n"}
                )
                assert inline.status_code == 422, inline.text  # would be accepted, then ignored
                assert inline.json()["message"].startswith("warm: only a stored policy")
                await wait_pool(plane, 1)
                assert (await run_sandbox_events(admin, agent))["warm"] is True
                await wait_pool(plane, 1)  # refilled behind the run
                r = await admin.put("/v1/policies/warm-box", json={**policy, "warm": 0})
                assert r.status_code == 200, r.text
                assert plane.cp.manager.pool_status() == {}
                assert (await run_sandbox_events(admin, agent))["warm"] is False
