"""Two control-plane replicas and three sandbox hosts (`aamp host serve`, each its own
process, home and runtime directory) on one real PostgreSQL database, real gVisor, loopback
only. The replicas' own hosts are drained, so every sandbox goes to a remote host over the
link.

- sandboxes spread over the three hosts; each is reached from the other replica too (exec,
  files in and out, describe, list, destroy), through the link;
- `kill -9` of the host running a run's sandbox: the host is marked lost within the lost
  timeout, the run fails naming the lost host, its other sandboxes answer 410 with the
  reason; started again it reaps everything (no sandbox process left) and takes a new epoch;
- a placement never lands on a draining or lost host, and a drained host's sandboxes go on;
- the audit chain verifies at the end.

The link attacked from the untrusted side is in `test_link_refusals.py`.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
from fleet_processes import Fleet, host_state, wait_for

HEARTBEAT, LOST = 1.0, 4.0


def _exec(client: httpx.Client, sandbox_id: str, *argv: str) -> tuple[int, bytes]:
    import base64
    import json

    r = client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": list(argv)})
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines()]
    out = b"".join(base64.b64decode(x["data"]) for x in lines if x.get("stream") == "stdout")
    return lines[-1]["exit_code"], out


def _make_agent(admin: httpx.Client, model_url: str) -> str:
    agent = admin.post("/v1/agents", json={"name": "fleet"}).json()["id"]
    assert admin.put("/v1/policies/p", json={"name": "p"}).status_code == 200
    endpoint = {"base_url": model_url, "models": ["scripted"]}
    assert admin.put("/v1/model-endpoints/llm-fleet", json=endpoint).status_code == 200
    for kind, item in (("policy", "p"), ("image", "base"), ("model-endpoint", "llm-fleet")):
        r = admin.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": item})
        assert r.status_code == 201, r.text
    definition = {
        "model": {"endpoint": "llm-fleet", "name": "scripted", "timeout": "60s", "retries": 0},
        "system_prompt": "test",
        "tools": ["shell"],
        "policy": "p",
        "limits": {"max_steps": 10, "wall_time": "5m", "tool_timeout": "120s"},
    }
    assert admin.put(f"/v1/agents/{agent}/draft", json=definition).status_code == 200
    assert admin.post(f"/v1/agents/{agent}/publish").status_code == 200
    return agent


def test_two_replicas_three_hosts(tmp_path: Path, base_image, postgres_server) -> None:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("sandbox hosts need root and runsc here")
    from scripted_model import ScriptedModelServerForTests

    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")
    fleet = Fleet(tmp_path, url.render_as_string(hide_password=False), str(HEARTBEAT), str(LOST))
    turns = [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 120"}}]},
        # The host dies during the tool call; the model is asked again and waits here.
        {"sleep": 60, "content": "never"},
    ]
    left: list[int] = []
    try:
        a = fleet.replica("rep-a")
        b = fleet.replica("rep-b")
        for own in ("rep-a", "rep-b"):  # only the remote hosts take work here
            assert a.post(f"/v1/hosts/{own}/drain").status_code == 200
        hosts = {h: fleet.add_host(a, h) for h in ("h1", "h2", "h3")}
        for host in hosts.values():
            host.start()
        for h in hosts:
            wait_for(lambda h=h: host_state(a, h)["state"] == "active", 120)

        # -- spread, and reached from either replica -------------------------------------
        made = []
        for i in range(6):
            via = (a, b)[i % 2]
            r = via.post("/v1/sandboxes", json={"image": "base", "ttl_seconds": 600})
            assert r.status_code == 201, r.text
            made.append(r.json())
        on = {s["id"]: s["host"] for s in made}
        assert set(on.values()) == {"h1", "h2", "h3"}, on
        for i, s in enumerate(made):
            other = (b, a)[i % 2]  # the replica that did not make it
            code, out = _exec(other, s["id"], "sh", "-c", "echo $((6*7))")
            assert (code, out) == (0, b"42\n")
            assert other.get(f"/v1/sandboxes/{s['id']}").json()["host"] == on[s["id"]]
        first = made[0]["id"]
        r = b.put(f"/v1/sandboxes/{first}/files", params={"path": "note.txt"}, content=b"via b")
        assert r.status_code == 204, r.text
        assert a.get(f"/v1/sandboxes/{first}/files", params={"path": "note.txt"}).content == (
            b"via b"
        )
        listed = {s["id"]: s["host"] for s in b.get("/v1/sandboxes").json()}
        assert listed == on
        used = {h: host_state(a, h)["used_sandboxes"] for h in hosts}
        assert used == {h: list(on.values()).count(h) for h in hosts}

        # -- kill -9 of the host running a run's sandbox ---------------------------------
        with ScriptedModelServerForTests(turns) as model:
            agent = _make_agent(a, model.base_url)
            run_id = a.post(f"/v1/agents/{agent}/runs", json={"task": "t"}).json()["id"]
            wait_for(lambda: len(model.requests) >= 1, 120)
            time.sleep(2)  # the tool call has started
            sandbox_id = a.get(f"/v1/runs/{run_id}").json()["sandbox_id"]
            assert len(model.requests) == 1
            victim_id = b.get(f"/v1/sandboxes/{sandbox_id}").json()["host"]
            victim = hosts[victim_id]
            others_there = [s for s, h in on.items() if h == victim_id]
            epoch = host_state(a, victim_id)["epoch"]
            assert victim.sandbox_pids(), "the run's sandbox runs on its host"
            victim.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
            killed = time.monotonic()
            victim.proc.wait()  # type: ignore[union-attr]
            wait_for(lambda: a.get(f"/v1/runs/{run_id}").json()["status"] == "failed", 60, 0.05)
            failed_after = time.monotonic() - killed
            run = a.get(f"/v1/runs/{run_id}").json()
        assert host_state(b, victim_id)["state"] == "lost"
        # Lost within the timeout (a sweep every heartbeat), the run failed at once.
        assert failed_after <= LOST + 2 * HEARTBEAT + 2, failed_after
        assert f"host {victim_id} was lost" in run["reason"], run
        assert sandbox_id in run["reason"]
        for s in others_there:
            gone = b.get(f"/v1/sandboxes/{s}")
            assert gone.status_code == 410 and f"host {victim_id} was lost" in gone.text
        # No placement lands on the lost host.
        meanwhile = [b.post("/v1/sandboxes", json={"image": "base"}).json() for _ in range(3)]
        assert victim_id not in {s["host"] for s in meanwhile}, meanwhile
        for s in meanwhile:
            assert b.delete(f"/v1/sandboxes/{s['id']}").status_code == 204
        # gVisor's processes outlive a kill -9 of their host; they are reaped at its restart.
        victim.start()
        wait_for(lambda: host_state(a, victim_id)["epoch"] == epoch + 1, 120)
        assert host_state(a, victim_id)["state"] == "active"
        assert victim.sandbox_pids() == []
        assert host_state(a, victim_id)["used_sandboxes"] == 0
        for s in others_there:
            assert b.get(f"/v1/sandboxes/{s}").status_code == 404  # forgotten: a new life

        # -- drain: no new work to it, its sandboxes go on -------------------------------
        live = [s for s, h in on.items() if h != victim_id]
        drained_id = on[live[0]]
        assert a.post(f"/v1/hosts/{drained_id}/drain").json()["state"] == "draining"
        later = [a.post("/v1/sandboxes", json={"image": "base"}).json() for _ in range(3)]
        assert drained_id not in {s["host"] for s in later}, later
        assert {s["host"] for s in later} <= set(hosts) - {drained_id}
        for s in live:
            assert _exec(b, s, "true")[0] == 0  # the drained host's sandboxes still answer
        for s in [*live, *(x["id"] for x in later)]:
            assert a.delete(f"/v1/sandboxes/{s}").status_code == 204
        assert host_state(a, drained_id)["used_sandboxes"] == 0
        assert all(host_state(a, h)["used_sandboxes"] == 0 for h in hosts)
        assert not any(h.sandbox_pids() for h in hosts.values())

        verified = a.get("/v1/audit/verify").json()
        assert verified["ok"], verified
    finally:
        left = fleet.close()
    assert left == []
