"""The guard's hot path on a real PostgreSQL, where a bearer token, its user and grants are
read on the event loop's own connections (`aamp.store.store.read_plan`): every decision is
audited, and a removed grant or a revoked token counts from the very next request."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from api_plane import Plane, plane_settings, running_plane


@pytest.fixture
async def pg_plane(tmp_path: Path, postgres_server) -> AsyncIterator[Plane]:  # type: ignore[no-untyped-def]
    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")
    settings = plane_settings(tmp_path, AAMP_DATABASE_URL=url.render_as_string(hide_password=False))
    async with running_plane(settings) as plane:
        yield plane


async def test_grant_and_token_revocation_count_from_the_next_request(pg_plane: Plane) -> None:
    assert pg_plane.cp.store.dialect == "postgresql"
    op_token = await pg_plane.user("op", "operator")
    async with pg_plane.client(pg_plane.admin_token) as admin:
        agent = (await admin.post("/v1/agents", json={"name": "pg-guard"})).json()["id"]
        grant = await admin.post(f"/v1/agents/{agent}/grants", json={"user": "op", "level": "view"})
        assert grant.status_code == 201
        async with pg_plane.client(op_token) as op:
            allowed = await op.get(f"/v1/agents/{agent}")
            assert allowed.status_code == 200 and allowed.json()["name"] == "pg-guard"
            assert pg_plane.decision(allowed.headers["x-request-id"]) == "allow"

            removed = await admin.delete(f"/v1/agents/{agent}/grants/{grant.json()['id']}")
            assert removed.status_code == 204
            denied = await op.get(f"/v1/agents/{agent}")
            assert denied.status_code == 403
            assert pg_plane.decision(denied.headers["x-request-id"]) == "deny"

            tokens = (await admin.get("/v1/tokens")).json()
            op_token_id = next(t["id"] for t in tokens if t["username"] == "op")
            assert (await admin.delete(f"/v1/tokens/{op_token_id}")).status_code in (200, 204)
            revoked = await op.get(f"/v1/agents/{agent}")
            assert revoked.status_code == 401
            assert "revoked" in revoked.json()["message"]
