"""Granting a knowledge base to an agent: one that exists is granted; one that does not is
refused — a 404 naming it, nothing granted, and the refusal on record with the actor (the
guard's allow, then the route's deny) — as a policy or service that does not exist is."""

from __future__ import annotations

from test_refusals_in_allowed import records


async def test_a_knowledge_base_that_does_not_exist_is_not_granted(plane) -> None:
    builder = await plane.user("bea", "builder")
    async with plane.client(plane.admin_token) as admin:
        agent = (await admin.post("/v1/agents", json={"name": "reader"})).json()["id"]
        ghost = {"kind": "knowledge-base", "name": "ghost"}
        refused = await admin.post(f"/v1/agents/{agent}/resources", json=ghost)
        granted_after_refusal = (await admin.get(f"/v1/agents/{agent}/resources")).json()
    async with plane.client(builder) as c:
        assert (await c.post("/v1/knowledge-bases", json={"name": "handbook"})).status_code == 201
    async with plane.client(plane.admin_token) as admin:
        real = {"kind": "knowledge-base", "name": "handbook"}
        granted = await admin.post(f"/v1/agents/{agent}/resources", json=real)
        kept = (await admin.get(f"/v1/agents/{agent}/resources")).json()

    assert refused.status_code == 404, refused.text
    assert refused.json()["message"] == "no knowledge base named 'ghost'"
    assert granted_after_refusal == []
    found = records(plane, refused.headers["x-request-id"])
    assert [(r["action"], r["decision"], r["actor"]) for r in found] == [
        ("agent_resource.grant", "allow", "user:admin"),
        ("agent_resource.grant", "deny", "user:admin"),
    ]
    assert found[1]["resource"] == f"agent:{agent}"
    assert found[1]["reason"] == "no knowledge base named 'ghost'"

    assert granted.status_code == 201, granted.text
    assert [(g["kind"], g["name"]) for g in kept] == [("knowledge-base", "handbook")]
