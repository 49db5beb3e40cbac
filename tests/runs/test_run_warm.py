"""A run says whether its sandbox came warm: with `AAMP_WARM_POOL_LEARN`, the first run of a
policy boots cold and teaches the manager its boot key; the next run of it is handed a warm
sandbox from that pool (real gVisor sandboxes, the scripted model double)."""

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


async def test_the_second_run_of_a_policy_gets_a_warm_sandbox(tmp_path: Path, base_image) -> None:
    settings = booting_plane_settings(tmp_path, AAMP_WARM_POOL_LEARN="1")
    async with running_plane(settings) as plane:
        turns = [{"content": "first"}, {"content": "second"}]
        with ScriptedModelServerForTests(turns) as model:
            async with plane.client(plane.admin_token) as admin:
                agent = await make_agent(admin, "warmed", model.base_url, POLICY)
                warm = []
                for n in range(2):
                    made = await admin.post(f"/v1/agents/{agent}/runs", json={"task": "go"})
                    assert made.status_code == 201, made.text
                    run = await wait_end(admin, made.json()["id"])
                    assert run["status"] == "succeeded", run
                    events = parse_sse((await admin.get(f"/v1/runs/{run['id']}/events")).text)
                    [created] = [e for e in events if e["event"] == "sandbox.created"]
                    warm.append(created["data"]["warm"])
                    if n == 0:  # the pool fills behind the first run
                        deadline = time.monotonic() + 60
                        while not any(plane.cp.manager.pool_status().values()):
                            assert time.monotonic() < deadline, "the pool never filled"
                            await asyncio.sleep(0.1)
                assert warm == [False, True]
