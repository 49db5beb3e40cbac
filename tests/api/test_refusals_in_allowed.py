"""Every refusal is decided by `allowed()` and is the guard's one audit record, from the
untrusted side: an operator running or reading an unpublished version by its number, a
non-admin giving a policy inline, a sandbox or run using something not granted to the agent
(admins included), refused credentials (recorded with the user and token they name, not as
`anonymous`), and the OpenAPI document (only for signed-in users, audited)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text

DEFINITION = {"model": {"endpoint": "llm", "name": "m"}, "tools": ["python"]}
LLM = {"base_url": "http://127.0.0.1:9/v1", "models": ["m"]}


def records(plane, request_id: str) -> list[dict[str, Any]]:
    """Every audit record a request left, in order."""
    with plane.cp.store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT actor, action, resource, decision, reason, details FROM audit_records"
                " WHERE request_id = :r ORDER BY seq"
            ),
            {"r": request_id},
        ).all()
    return [
        {
            "actor": a,
            "action": b,
            "resource": c,
            "decision": d,
            "reason": e,
            "details": json.loads(f),
        }
        for a, b, c, d, e, f in rows
    ]


def the_one_denial(plane, resp, action: str, actor: str) -> dict[str, Any]:
    """The request was refused by the guard: 403, and exactly one record, a denial."""
    assert resp.status_code == 403, resp.text
    found = records(plane, resp.headers["x-request-id"])
    assert [(r["action"], r["decision"], r["actor"]) for r in found] == [(action, "deny", actor)]
    assert found[0]["reason"] == resp.json()["message"]
    return found[0]


async def _agent(admin, name: str, policy: dict[str, Any], grants: list[tuple[str, str]]) -> str:
    agent = (await admin.post("/v1/agents", json={"name": name})).json()["id"]
    assert (await admin.put(f"/v1/policies/{policy['name']}", json=policy)).status_code == 200
    assert (await admin.put("/v1/model-endpoints/llm", json=LLM)).status_code == 200
    for kind, item in grants:
        r = await admin.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": item})
        assert r.status_code == 201, r.text
    return agent


async def _runs(plane) -> int:
    with plane.cp.store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM runs")).scalar() or 0)


async def test_below_edit_only_published_versions_run_or_are_read(plane) -> None:
    op = await plane.user("op", "operator")
    async with plane.client(plane.admin_token) as admin:
        policy = {"name": "plain", "image": "base"}
        grants = [("policy", "plain"), ("image", "base"), ("model-endpoint", "llm")]
        agent = await _agent(admin, "drafts", policy, grants)
        draft = {**DEFINITION, "policy": "plain"}
        assert (await admin.put(f"/v1/agents/{agent}/draft", json=draft)).status_code == 200
        assert (await admin.post(f"/v1/agents/{agent}/publish")).status_code == 200
        edited = {**draft, "system_prompt": "The unpublished draft."}
        saved = await admin.put(f"/v1/agents/{agent}/draft", json=edited)
        assert saved.json()["version"] == 2 and saved.json()["status"] == "draft"
        r = await admin.post(f"/v1/agents/{agent}/grants", json={"user": "op", "level": "run"})
        assert r.status_code == 201
    async with plane.client(op) as c:
        for asked in (2, "draft", 9):
            refused = await c.post(f"/v1/agents/{agent}/runs", json={"task": "t", "version": asked})
            record = the_one_denial(plane, refused, "run.create", "user:op")
            what = "the draft" if asked == "draft" else f"version {asked}"
            assert f"{what} of agent:{agent} is not a published version" in record["reason"]
            assert "below edit only published versions run" in record["reason"]
        assert await _runs(plane) == 0
        for asked in ("2", "draft"):
            refused = await c.get(f"/v1/agents/{agent}/versions/{asked}")
            record = the_one_denial(plane, refused, "agent_version.read", "user:op")
            assert "is not a published version" in record["reason"]
        assert (await c.get(f"/v1/agents/{agent}/versions/1")).status_code == 200
        assert (await c.get(f"/v1/agents/{agent}/versions/latest")).json()["version"] == 1


async def test_sandbox_refusals_are_decided_by_allowed(plane) -> None:
    op = await plane.user("op", "operator")
    async with plane.client(plane.admin_token) as admin:
        service = {"upstream": "https://crm.test", "auth": "bearer", "secrets": ["crm_token"]}
        assert (await admin.put("/v1/services/crm", json=service)).status_code == 200
        policy = {"name": "with-crm", "image": "base", "services": ["crm"]}
        agent = await _agent(admin, "sb", policy, [("policy", "with-crm"), ("image", "base")])
        r = await admin.post(f"/v1/agents/{agent}/grants", json={"user": "op", "level": "run"})
        assert r.status_code == 201
        # An admin naming an agent is bound by its grants too.
        refused = await admin.post("/v1/sandboxes", json={"agent": agent, "policy": "with-crm"})
        record = the_one_denial(plane, refused, "sandbox.create", "user:admin")
        assert record["reason"].startswith(f"service:crm is not granted to agent:{agent}")
        assert f"aamp grant attach {agent} service crm" in record["reason"]
    async with plane.client(op) as c:
        inline = {
            "agent": agent,
            "policy": "with-crm",
            "policy_document": "name: wide\nimage: base\negress: {default: allow}\n",
        }
        record = the_one_denial(
            plane, await c.post("/v1/sandboxes", json=inline), "sandbox.create", "user:op"
        )
        assert record["reason"].startswith("policy_document: only admins give a policy inline")
        refused = await c.post("/v1/sandboxes", json={"agent": agent, "policy": "with-crm"})
        assert (
            "service:crm is not granted"
            in the_one_denial(plane, refused, "sandbox.create", "user:op")["reason"]
        )
        refused = await c.post("/v1/sandboxes", json={"agent": agent})
        assert the_one_denial(plane, refused, "sandbox.create", "user:op")["reason"].startswith(
            f"policy: name a policy granted to agent:{agent}"
        )
    assert plane.cp.manager.list() == []


async def test_runs_need_the_policy_its_image_and_services_granted(plane) -> None:
    async with plane.client(plane.admin_token) as admin:
        service = {"upstream": "https://crm.test", "auth": "bearer", "secrets": ["crm_token"]}
        assert (await admin.put("/v1/services/crm", json=service)).status_code == 200
        policy = {"name": "browsing", "image": "browser", "services": ["crm"]}
        agent = await _agent(admin, "needs", policy, [])
        definition = {**DEFINITION, "policy": "browsing", "tools": ["python", "service:crm"]}
        assert (await admin.put(f"/v1/agents/{agent}/draft", json=definition)).status_code == 200
        assert (await admin.post(f"/v1/agents/{agent}/publish")).status_code == 200
        missing = ["policy:browsing", "image:browser", "service:crm", "model-endpoint:llm"]
        while missing:
            refused = await admin.post(f"/v1/agents/{agent}/runs", json={"task": "t"})
            record = the_one_denial(plane, refused, "run.create", "user:admin")
            assert record["resource"] == f"agent:{agent}"
            assert record["reason"].startswith(
                f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not granted"
            )
            kind, name = missing.pop(0).split(":")
            r = await admin.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": name})
            assert r.status_code == 201
    assert await _runs(plane) == 0


async def test_refused_credentials_are_recorded_with_whom_they_name(plane) -> None:
    cp = plane.cp
    token = await plane.user("bob", "builder", "bob-password-1")
    bob_token = (await cp.store.run(cp.directory.list_tokens, "bob"))[0].id
    async with plane.client(plane.admin_token) as admin:
        assert (await admin.delete(f"/v1/tokens/{bob_token}")).status_code == 200
    async with plane.client(token) as c:
        gone = await c.get("/v1/me")
    assert gone.status_code == 401
    [record] = records(plane, gone.headers["x-request-id"])
    assert (record["actor"], record["decision"]) == ("user:bob", "deny")
    assert record["details"]["token"] == bob_token and record["details"]["via"] == "token"
    assert "revoked" in record["reason"]

    made, secret = await cp.store.run(lambda: cp.directory.create_token("bob", "old", days=1))
    with cp.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE api_tokens SET expires_at = '2000-01-01T00:00:00.000000Z' WHERE id = :i"),
            {"i": made.id},
        )
    async with plane.client(secret) as c:
        expired = await c.get("/v1/agents")
    [record] = records(plane, expired.headers["x-request-id"])
    assert (record["actor"], record["action"], record["details"]["token"]) == (
        "user:bob",
        "agent.list",
        made.id,
    )
    assert "expired" in record["reason"]

    dan = await plane.user("dan", "operator")
    async with plane.client(plane.admin_token) as admin:
        assert (await admin.patch("/v1/users/dan", json={"disabled": True})).status_code == 200
    async with plane.client(dan) as c:
        locked = await c.get("/v1/me")
    [record] = records(plane, locked.headers["x-request-id"])
    assert (record["actor"], record["reason"]) == ("user:dan", "this account is disabled")

    async with plane.client() as c:
        login = await c.post("/v1/session", json={"username": "bob", "password": "bob-password-1"})
        assert login.status_code == 200
        refused = await c.post("/v1/agents", json={"name": "x1"})
    assert refused.status_code == 403 and refused.json()["code"] == "csrf_failed"
    [record] = records(plane, refused.headers["x-request-id"])
    assert (record["actor"], record["action"], record["decision"]) == (
        "user:bob",
        "agent.create",
        "deny",
    )
    assert record["details"]["via"] == "session" and "x-csrf-token" in record["reason"]


async def test_the_openapi_document_needs_a_signed_in_user_and_is_audited(plane) -> None:
    async with plane.client() as anonymous:
        refused = await anonymous.get("/openapi.json")
        assert refused.status_code == 401
        [record] = records(plane, refused.headers["x-request-id"])
        assert (record["actor"], record["action"], record["decision"]) == (
            "anonymous",
            "api.schema",
            "deny",
        )
        # FastAPI's Swagger and ReDoc pages (scripts from a CDN) are not served at all.
        for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert (await anonymous.get(page)).status_code == 404
    operator = await plane.user("olly", "operator")
    async with plane.client(operator) as c:
        got = await c.get("/openapi.json")
    assert got.status_code == 200 and "/v1/agents/{agent_id}/runs" in got.json()["paths"]
    [record] = records(plane, got.headers["x-request-id"])
    assert (record["actor"], record["decision"]) == ("user:olly", "allow")


async def test_a_path_with_control_characters_is_refused_and_recorded(plane) -> None:
    """A control character in a path's id (`%01`, an escape sequence) reached the audit record
    as it was and failed as bad audit input: a 400 with no record of who asked. Now it is named
    escaped in the guard's one record."""
    op = await plane.user("op", "operator")
    async with plane.client(op) as c:
        refused = await c.delete("/v1/agents/%1b%5b31m")
    denial = the_one_denial(plane, refused, "agent.delete", "user:op")
    assert denial["resource"] == "agent:\\x1b[31m"
    async with plane.client(plane.admin_token) as c:
        missing = await c.get("/v1/sandboxes/a%01b")
    assert missing.status_code == 404, missing.text
    found = records(plane, missing.headers["x-request-id"])
    assert [(r["resource"], r["decision"]) for r in found][:1] == [("sandbox:a\\x01b", "allow")]


async def test_a_failed_login_with_a_line_break_in_the_name_is_recorded(plane) -> None:
    """`^…$` let one trailing newline through (`$` matches before it): `admin\\n` passed the
    username pattern, reached the audit record as it was, and the failed login went unrecorded
    (a 400 audit input error). Every such pattern now ends at `\\Z`."""
    async with plane.client() as c:
        r = await c.post("/v1/session", json={"username": "admin\n", "password": "wrong-pass-1"})
    assert r.status_code in (400, 401), r.text
    assert r.json()["code"] != "audit_input_error", r.text
    found = records(plane, r.headers["x-request-id"])
    assert [(x["action"], x["decision"]) for x in found][-1:] == [("login", "deny")], found
    assert found[-1]["resource"] == "user:?"  # a name that is no username is not written out
