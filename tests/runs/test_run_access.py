"""Who may do what with agent versions and runs, through the API: an operator without `run`
gets 403 and an audit record; operators never see drafts, nor other operators' runs; edits go
to a draft and publishing freezes it; draft runs need `edit`; inputs are checked against the
policy's data.inbound."""

from __future__ import annotations

import base64

from run_helpers import make_agent, wait_end
from scripted_model import ScriptedModelServerForTests
from sqlalchemy import text

POLICY = {
    "name": "plain",
    "image": "base",
    "data": {"inbound": {"max_bytes": "100B", "types": ["csv"]}},
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_versions_runs_and_visibility(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    op1 = await plane.user("op1", "operator")
    op2 = await plane.user("op2", "operator")
    op3 = await plane.user("op3", "operator")
    builder = await plane.user("bob", "builder")
    with ScriptedModelServerForTests([{"content": "one"}, {"content": "two"}]) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(admin, "shared", model.base_url, POLICY)
            for user, level in (("op1", "run"), ("op2", "run"), ("op3", "view"), ("bob", "edit")):
                r = await admin.post(
                    f"/v1/agents/{agent}/grants", json={"user": user, "level": level}
                )
                assert r.status_code == 201
        async with (
            plane.client(op1) as c1,
            plane.client(op2) as c2,
            plane.client(op3) as c3,
            plane.client(builder) as cb,
        ):
            # A builder edits: a new draft (version 2); version 1 stays as published.
            bad = await cb.put(f"/v1/agents/{agent}/draft", json={"tools": ["bash"]})
            assert bad.status_code == 400
            assert "tools[0]: unknown tool 'bash'" in bad.json()["message"]
            assert "model: required" in bad.json()["message"]
            edited = (await cb.get(f"/v1/agents/{agent}/versions/1")).json()["definition"]
            edited["system_prompt"] = "Changed."
            draft = await cb.put(f"/v1/agents/{agent}/draft", json=edited)
            assert draft.status_code == 200 and draft.json()["version"] == 2
            assert draft.json()["status"] == "draft"
            # Operators see published versions only.
            assert [
                v["version"] for v in (await c1.get(f"/v1/agents/{agent}/versions")).json()
            ] == [1]
            assert (await c1.get(f"/v1/agents/{agent}/versions/draft")).status_code == 403
            assert [
                v["version"] for v in (await cb.get(f"/v1/agents/{agent}/versions")).json()
            ] == [1, 2]
            # Draft runs need edit.
            refused = await c1.post(
                f"/v1/agents/{agent}/runs", json={"task": "t", "version": "draft"}
            )
            assert refused.status_code == 403
            # Without run: 403, audited.
            denied = await c3.post(f"/v1/agents/{agent}/runs", json={"task": "t"})
            assert denied.status_code == 403
            rid = denied.headers["x-request-id"]
            assert plane.decision(rid) == "deny"
            # Inputs are checked against data.inbound (type, then size); nothing starts.
            wrong = await c1.post(
                f"/v1/agents/{agent}/runs",
                json={"task": "t", "inputs": [{"name": "x.exe", "content_b64": _b64(b"MZ")}]},
            )
            assert wrong.status_code == 400 and "data.inbound.types" in wrong.json()["message"]
            big = await c1.post(
                f"/v1/agents/{agent}/runs",
                json={"task": "t", "inputs": [{"name": "a.csv", "content_b64": _b64(b"x" * 101)}]},
            )
            assert big.status_code == 413 and "data.inbound.max_bytes" in big.json()["message"]
            # Two operators' runs: each sees only their own; the editor sees both.
            run1 = (await c1.post(f"/v1/agents/{agent}/runs", json={"task": "a"})).json()
            run2 = (await c2.post(f"/v1/agents/{agent}/runs", json={"task": "b"})).json()
            assert run1["version"] == 1
            await wait_end(c1, run1["id"])
            await wait_end(c2, run2["id"])
            assert [r["id"] for r in (await c1.get("/v1/runs")).json()] == [run1["id"]]
            assert (await c1.get(f"/v1/runs/{run2['id']}")).status_code == 403
            assert (await c1.get(f"/v1/runs/{run2['id']}/events")).status_code == 403
            assert {r["id"] for r in (await cb.get("/v1/runs")).json()} == {run1["id"], run2["id"]}
            # Publishing freezes the draft as version 2; there is no draft left to publish.
            published = await cb.post(f"/v1/agents/{agent}/publish")
            assert published.json()["version"] == 2 and published.json()["status"] == "published"
            assert (await cb.post(f"/v1/agents/{agent}/publish")).status_code == 409
    with cp.store.engine.connect() as conn:
        reasons = (
            conn.execute(
                text(
                    "SELECT reason FROM audit_records"
                    " WHERE action = 'run.file_in' AND decision = 'deny'"
                )
            )
            .scalars()
            .all()
        )
    assert any("data.inbound.types" in r for r in reasons)
    assert any("data.inbound.max_bytes" in r for r in reasons)


async def test_a_run_names_a_version_the_store_can_hold(run_plane) -> None:
    """A version number out of range is a 422 naming the field, never a 500 from the
    database (schemathesis found `version: -3e31` overflowing SQLite's INTEGER)."""
    with ScriptedModelServerForTests([{"content": "ok"}]) as model:
        async with run_plane.client(run_plane.admin_token) as admin:
            agent = await make_agent(admin, "versions", model.base_url, POLICY)
            for bad in (-(10**31), 0, 10**12):
                got = await admin.post(
                    f"/v1/agents/{agent}/runs", json={"task": "t", "version": bad}
                )
                assert got.status_code == 422, (bad, got.text)
                assert "version" in got.text
