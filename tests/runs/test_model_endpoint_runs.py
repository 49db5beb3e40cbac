"""Runs reach their model only through the agent's granted model endpoint, from the host, with
the address checks of egress: a granted endpoint at a loopback test server works end to end,
its API key revealed from the vault for each model call (audited with name and version, never
the value) and every connection audited with its address class; a name that resolves to the
metadata address is refused (the model is never asked) while that address named exactly is
reached — inside a network namespace of the test's own (endpoint_probe.py)."""

from __future__ import annotations

import json
from pathlib import Path

from run_helpers import make_agent, probe_in_netns, wait_end
from scripted_model import ScriptedModelServerForTests
from sqlalchemy import text

PROBE = Path(__file__).with_name("endpoint_probe.py")
KEY = "sk-unmistakable-model-key-4417"


async def test_a_granted_loopback_endpoint_works_and_each_key_use_is_audited(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    turns = [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi"}}]},
        {"content": "done"},
    ]
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            assert (await admin.put("/v1/secrets/llm_key", json={"value": KEY})).status_code == 200
            agent = await make_agent(admin, "keyed", model.base_url, {"name": "p", "image": "base"})
            r = await admin.put(
                "/v1/model-endpoints/llm-keyed",
                json={
                    "base_url": model.base_url,
                    "api_key_secret": "llm_key",
                    "models": ["scripted"],
                },
            )
            assert r.status_code == 200, r.text
            made = await admin.post(f"/v1/agents/{agent}/runs", json={"task": "t"})
            run = await wait_end(admin, made.json()["id"])
    assert run["status"] == "succeeded" and run["answer"] == "done", run
    assert [h["authorization"] for h in model.headers] == [f"Bearer {KEY}"] * 2
    with cp.store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT action, resource, decision, reason, details FROM audit_records"
                " WHERE actor = :a ORDER BY seq"
            ),
            {"a": f"run:{run['id']}"},
        ).all()
        everything = conn.execute(text("SELECT reason, details FROM audit_records")).all()
    reveals = [r for r in rows if r[0] == "secret.reveal"]
    assert len(reveals) == 2  # one per model call
    for _, resource, decision, reason, details in reveals:
        assert (resource, decision, json.loads(details)) == (
            "secret:llm_key",
            "allow",
            {"version": 1},
        )
        assert "model endpoint llm-keyed" in reason
    connects = [r for r in rows if r[0] == "model.connect"]
    assert connects and all(r[2] == "allow" for r in connects)
    assert json.loads(connects[0][4])["addresses"] == [
        {"address": "127.0.0.1", "class": "loopback", "allowed": True}
    ]
    assert all(KEY not in f"{reason}{details}" for reason, details in everything)


def test_a_name_resolving_to_the_metadata_address_is_refused_unless_named_exactly(
    tmp_path: Path, base_image
) -> None:
    report = probe_in_netns(PROBE, tmp_path, timeout=400)
    assert report["registered"]["resolved"] == [
        {"address": "127.0.0.1", "address_class": "loopback"}
    ]
    rebound = report["rebound"]
    assert rebound["status"] == "failed"
    assert "model endpoint rebound" in rebound["reason"]
    assert "imds.test resolved to 169.254.169.254 is a metadata address" in rebound["reason"]
    assert report["requests_after_rebound"] == 0  # nothing reached the fake metadata host
    exact = report["exact"]
    assert exact["status"] == "succeeded" and exact["answer"] == "reached", exact
    assert report["requests_after_exact"] == 1
    refused = [c for c in report["connects"] if c["resource"] == "model-endpoint:rebound"]
    assert [c["decision"] for c in refused] == ["deny"]
    assert refused[0]["actor"] == f"run:{rebound['id']}"
    assert refused[0]["details"]["addresses"] == [
        {"address": "169.254.169.254", "class": "metadata", "allowed": False}
    ]
    reached = [c for c in report["connects"] if c["resource"] == "model-endpoint:exact"]
    assert [c["decision"] for c in reached] == ["allow"]
    assert reached[0]["details"]["address"] == "169.254.169.254"
