"""Two control-plane replicas on one real PostgreSQL database, each `aamp up` with its own
sandbox host serving a link (`AAMP_FLEET_LINK_LISTEN`), real gVisor, loopback only: a sandbox
on replica A's own host is served by replica B — describe, list, exec, files in and out,
destroy — through A's link, and a create B places on A's host boots there over the link; each
gives its capacity back and leaves no sandbox process. (Without the setting a replica's own
host serves no link: `test_sandbox_hosts.py` and the single-host tests run that way.)"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from fleet_processes import exec_in, fleet_on_postgres, free_port, host_state, wait_for

from aamp.sandbox import procs


def test_a_replicas_own_host_is_reached_from_another(
    tmp_path: Path, base_image, postgres_server
) -> None:
    fleet = fleet_on_postgres(tmp_path, postgres_server, "1", "15")
    left: list[int] = []
    try:
        a = fleet.replica("rep-a", AAMP_FLEET_LINK_LISTEN=f"127.0.0.1:{free_port()}")
        b = fleet.replica("rep-b", AAMP_FLEET_LINK_LISTEN=f"127.0.0.1:{free_port()}")
        for own in ("rep-a", "rep-b"):
            wait_for(lambda own=own: host_state(a, own)["link_address"] is not None, 60)
        assert b.post("/v1/hosts/rep-b/drain").status_code == 200  # everything on rep-a

        made = a.post("/v1/sandboxes", json={"image": "base", "ttl_seconds": 600})
        assert made.status_code == 201, made.text
        mine = made.json()["id"]
        assert made.json()["host"] == "rep-a"
        assert b.get(f"/v1/sandboxes/{mine}").json()["host"] == "rep-a"
        assert exec_in(b, mine, "echo $((6*7))") == (0, b"42\n")
        r = b.put(f"/v1/sandboxes/{mine}/files", params={"path": "note.txt"}, content=b"via b")
        assert r.status_code == 204, r.text
        assert a.get(f"/v1/sandboxes/{mine}/files", params={"path": "note.txt"}).content == (
            b"via b"
        )
        assert b.get(f"/v1/sandboxes/{mine}/files", params={"path": "note.txt"}).content == (
            b"via b"
        )
        # B places on A's host (its own is draining): booted there over A's link.
        sent = b.post("/v1/sandboxes", json={"image": "base", "ttl_seconds": 600})
        assert sent.status_code == 201, sent.text
        theirs = sent.json()["id"]
        assert sent.json()["host"] == "rep-a"
        assert exec_in(a, theirs, "echo here") == (0, b"here\n")  # A's own manager runs it
        listed = {s["id"]: s["host"] for s in b.get("/v1/sandboxes").json()}
        assert listed == {mine: "rep-a", theirs: "rep-a"}, listed
        assert {s["id"] for s in a.get("/v1/sandboxes").json()} == {mine, theirs}
        assert host_state(a, "rep-a")["used_sandboxes"] == 2

        # A run B drives, its sandbox on A's host: it runs there (its policy asks nobody, so
        # B has no questions to be sent; B set an answerer on A's link and the run failed).
        run = _run_of_b(b)
        assert run["status"] == "succeeded", run
        created = b.get("/v1/audit", params={"action": "sandbox.create"}).json()["records"]
        assert created[-1]["details"]["host"] == "rep-a", created[-1]

        assert b.delete(f"/v1/sandboxes/{mine}").status_code == 204  # through A's link
        assert a.get(f"/v1/sandboxes/{mine}").status_code == 404
        assert b.get(f"/v1/sandboxes/{mine}").status_code == 404
        assert a.delete(f"/v1/sandboxes/{theirs}").status_code == 204  # A's own, here
        assert b.get(f"/v1/sandboxes/{theirs}").status_code == 404
        assert host_state(b, "rep-a")["used_sandboxes"] == 0
        runtime_a = fleet.replicas[0][1]
        assert procs.pids_matching(f"--root={runtime_a}/runsc") == []
        assert a.get("/v1/audit/verify").json()["ok"]
    finally:
        left = fleet.close()
    assert left == []


def _run_of_b(b: httpx.Client) -> dict:
    from scripted_model import ScriptedModelServerForTests  # tests/agents

    turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi"}}]},
             {"content": "done"}]  # fmt: skip
    with ScriptedModelServerForTests(turns) as model:
        agent = b.post("/v1/agents", json={"name": "far"}).json()["id"]
        policy = {"name": "closed", "image": "base", "egress": {"default": "block"}}
        assert b.put("/v1/policies/closed", json=policy).status_code == 200
        endpoint = {"base_url": model.base_url, "models": ["scripted"]}
        assert b.put("/v1/model-endpoints/llm", json=endpoint).status_code == 200
        for kind, item in (("policy", "closed"), ("image", "base"), ("model-endpoint", "llm")):
            r = b.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": item})
            assert r.status_code == 201, r.text
        definition = {"model": {"endpoint": "llm", "name": "scripted", "retries": 0},
                      "system_prompt": "test", "tools": ["shell"], "policy": "closed"}  # fmt: skip
        assert b.put(f"/v1/agents/{agent}/draft", json=definition).status_code == 200
        assert b.post(f"/v1/agents/{agent}/publish").status_code == 200
        made = b.post(f"/v1/agents/{agent}/runs", json={"task": "say hi"})
        assert made.status_code == 201, made.text
        deadline = time.monotonic() + 300
        while (run := b.get(f"/v1/runs/{made.json()['id']}").json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, run
            time.sleep(0.5)
    return run
