"""Model endpoints through the API, from a builder's side: an agent never names a URL or a
secret (refused naming the field, nothing saved); a model the endpoint does not serve is
refused naming `model.name`; running an agent whose endpoint is not granted is refused by
`allowed` (one audited denial); builders read endpoints and only admins write them; a
registration states the address classes its host resolved to, and a name resolving to a
metadata address is refused; endpoints migration 0005 made from agents' inline URLs refuse
runs until an admin confirms them (audited)."""

from __future__ import annotations

import json
from pathlib import Path

from api_plane import plane_settings, running_plane
from sqlalchemy import text

from aamp.egress.resolver import StaticResolver
from aamp.store import Store, migrate

POLICY = {"name": "plain", "image": "base"}
LLM = {"base_url": "http://127.0.0.1:9/v1", "api_key_secret": "llm_key", "models": ["m"]}


def records(cp, request_id: str) -> list[tuple[str, str, str, str, dict]]:
    with cp.store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT actor, action, decision, reason, details FROM audit_records"
                " WHERE request_id = :r ORDER BY seq"
            ),
            {"r": request_id},
        ).all()
    return [(a, b, c, d, json.loads(e)) for a, b, c, d, e in rows]


async def test_a_builders_agent_names_an_endpoint_never_a_url_or_a_secret(plane) -> None:
    builder = await plane.user("bob", "builder")
    async with plane.client(plane.admin_token) as admin:
        assert (await admin.put("/v1/model-endpoints/llm", json=LLM)).status_code == 200
        assert (await admin.put("/v1/policies/plain", json=POLICY)).status_code == 200
    async with plane.client(builder) as c:
        agent = (await c.post("/v1/agents", json={"name": "mine"})).json()["id"]
        base = {"tools": ["python"], "policy": "plain"}
        for model, field in (
            ({"base_url": "http://169.254.169.254/v1", "name": "m"}, "model.base_url"),
            (
                {"endpoint": "llm", "name": "m", "api_key_secret": "crm_token"},
                "model.api_key_secret",
            ),
            ({"endpoint": "llm", "name": "gpt-4"}, "model.name"),
        ):
            refused = await c.put(f"/v1/agents/{agent}/draft", json={**base, "model": model})
            assert refused.status_code == 400, refused.text
            assert f"{field}: " in refused.json()["message"]
        assert "serves m; not 'gpt-4'" in refused.json()["message"]
        assert (await c.get(f"/v1/agents/{agent}/versions")).json() == []  # nothing saved
        saved = await c.put(
            f"/v1/agents/{agent}/draft", json={**base, "model": {"endpoint": "llm", "name": "m"}}
        )
        assert saved.status_code == 200 and saved.json()["definition"]["model"] == {
            "endpoint": "llm",
            "name": "m",
            "timeout": 120,
            "retries": 3,
        }
        assert (await c.post(f"/v1/agents/{agent}/publish")).status_code == 200
    async with plane.client(plane.admin_token) as admin:
        for kind, name in (("policy", "plain"), ("image", "base")):
            r = await admin.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": name})
            assert r.status_code == 201
    async with plane.client(builder) as c:
        # The builder owns the agent; the endpoint (and so its secret) is not granted to it.
        refused = await c.post(f"/v1/agents/{agent}/runs", json={"task": "t"})
    assert refused.status_code == 403
    [(actor, action, decision, reason, _)] = records(plane.cp, refused.headers["x-request-id"])
    assert (actor, action, decision) == ("user:bob", "run.create", "deny")
    assert reason.startswith(f"model-endpoint:llm is not granted to agent:{agent}")
    assert f"aamp grant attach {agent} model-endpoint llm" in reason
    with plane.cp.store.engine.connect() as conn:
        reveals = conn.execute(
            text("SELECT count(*) FROM audit_records WHERE action = 'secret.reveal'")
        ).scalar()
        assert reveals == 0 and conn.execute(text("SELECT count(*) FROM runs")).scalar() == 0


async def test_builders_read_endpoints_admins_register_them_with_their_addresses(plane) -> None:
    cp = plane.cp
    cp.manager.resolver = StaticResolver(
        {"llm.test": ["10.1.2.3"], "imds.test": ["169.254.169.254"]}
    )
    builder = await plane.user("bob", "builder")
    async with plane.client(builder) as c:
        refused = await c.put("/v1/model-endpoints/llm", json={"base_url": "http://llm.test/v1"})
        assert refused.status_code == 403
        assert "only admin may do this" in refused.json()["message"]
    async with plane.client(plane.admin_token) as admin:
        made = await admin.put(
            "/v1/model-endpoints/llm", json={"base_url": "http://LLM.test:8080/v1/"}
        )
        assert made.status_code == 200, made.text
        assert made.json()["base_url"] == "http://llm.test:8080/v1"
        assert made.json()["resolved"] == [{"address": "10.1.2.3", "address_class": "private"}]
        assert made.json()["confirmed"] is True
        [*_, (actor, action, decision, _, details)] = records(cp, made.headers["x-request-id"])
        assert (actor, action, decision) == ("user:admin", "model_endpoint.written", "allow")
        assert details["resolved"] == [{"address": "10.1.2.3", "address_class": "private"}]
        # A name that resolves to the metadata address is refused, naming it and its class;
        # the same address named exactly is the admin's explicit choice.
        bad = await admin.put("/v1/model-endpoints/imds", json={"base_url": "http://imds.test/v1"})
        assert bad.status_code == 400
        assert (
            "imds.test resolved to 169.254.169.254 is a metadata address" in bad.json()["message"]
        )
        assert (await admin.get("/v1/model-endpoints/imds")).status_code == 404
        exact = await admin.put(
            "/v1/model-endpoints/imds", json={"base_url": "http://169.254.169.254:8080/v1"}
        )
        assert exact.json()["resolved"] == [
            {"address": "169.254.169.254", "address_class": "metadata"}
        ]
        for url, words in (
            ("ftp://llm.test/v1", "expected an http(s) URL"),
            ("http://user:pw@llm.test/v1", "credentials"),
            ("http://0x7f.1/v1", "write the address as 127.0.0.1"),
        ):
            bad = await admin.put("/v1/model-endpoints/x", json={"base_url": url})
            assert bad.status_code == 400 and words in bad.json()["message"], bad.text
    async with plane.client(builder) as c:
        listed = (await c.get("/v1/model-endpoints")).json()
        assert [e["name"] for e in listed] == ["imds", "llm"]
        assert (await c.get("/v1/model-endpoints/llm")).json()["api_key_secret"] is None


def _legacy_database(settings) -> None:
    """An installation from before model endpoints: an agent version with an inline URL and
    secret (schema 0004), as a builder could write them then."""
    with Store.open(settings, upgrade=False) as store:
        migrate.upgrade(store.engine, "0004")
        inline = {
            "model": {
                "base_url": "http://127.0.0.1:9/v1",
                "api_key_secret": "llm_key",
                "name": "m",
                "timeout": 120,
                "retries": 3,
            },
            "system_prompt": "Old.",
            "tools": ["python"],
            "policy": "plain",
            "limits": {},
        }
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO agents (id, name, owner, created_at)"
                    " VALUES ('ag-old', 'old', 'admin', '2026-01-01T00:00:00.000000Z')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO agent_versions (agent_id, version, status, definition,"
                    " created_at, created_by, updated_at, published_at, published_by)"
                    " VALUES ('ag-old', 1, 'published', :d, 't', 'admin', 't', 't', 'admin')"
                ),
                {"d": json.dumps(inline)},
            )


async def test_endpoints_made_by_the_migration_refuse_runs_until_confirmed(tmp_path: Path) -> None:
    settings = plane_settings(tmp_path)
    _legacy_database(settings)
    async with running_plane(settings) as plane:
        cp = plane.cp
        async with plane.client(plane.admin_token) as admin:
            [endpoint] = (await admin.get("/v1/model-endpoints")).json()
            assert endpoint["name"] == "127-0-0-1-9" and endpoint["confirmed"] is False
            assert endpoint["base_url"] == "http://127.0.0.1:9/v1"
            assert endpoint["api_key_secret"] == "llm_key" and endpoint["models"] == ["m"]
            version = (await admin.get("/v1/agents/ag-old/versions/1")).json()
            assert version["definition"]["model"]["endpoint"] == "127-0-0-1-9"
            assert "base_url" not in version["definition"]["model"]
            assert (await admin.put("/v1/policies/plain", json=POLICY)).status_code == 200
            for kind, name in (("policy", "plain"), ("image", "base")):
                await admin.post("/v1/agents/ag-old/resources", json={"kind": kind, "name": name})
            granted = (await admin.get("/v1/agents/ag-old/resources")).json()
            assert {"kind": "model-endpoint", "name": "127-0-0-1-9"} in [
                {"kind": g["kind"], "name": g["name"]} for g in granted
            ]
            refused = await admin.post("/v1/agents/ag-old/runs", json={"task": "t"})
            assert refused.status_code == 403
            [(actor, action, decision, reason, _)] = records(cp, refused.headers["x-request-id"])
            assert (actor, action, decision) == ("user:admin", "run.create", "deny")
            assert "model endpoint 127-0-0-1-9 is not confirmed" in reason
            assert "`aamp model-endpoint confirm 127-0-0-1-9`" in reason
            confirmed = await admin.post("/v1/model-endpoints/127-0-0-1-9/confirm")
            assert confirmed.status_code == 200 and confirmed.json()["confirmed"] is True
            [*_, (actor, action, decision, _, details)] = records(
                cp, confirmed.headers["x-request-id"]
            )
            assert (actor, action, decision) == ("user:admin", "model_endpoint.confirmed", "allow")
            assert details["resolved"] == [{"address": "127.0.0.1", "address_class": "loopback"}]
            allowed = await admin.post("/v1/agents/ag-old/runs", json={"task": "t"})
            assert allowed.status_code == 201, allowed.text
            assert records(cp, allowed.headers["x-request-id"])[0][2] == "allow"
            await cp.runs.wait(allowed.json()["id"])  # it fails: no image is built here
