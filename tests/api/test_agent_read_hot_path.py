"""The commonest API read, `GET /v1/agents/{id}` with a bearer token: the token, its user, the
user's grants and the agent are ONE SQL statement (`lookup.TOKEN_ACCESS_AGENT_SQL`), and
nothing of it is kept between requests — a removed grant, a revoked token or a deleted
agent counts from the very next request, on SQLite and on PostgreSQL. With a session cookie
the same route reads the agent in its resolver. Also: `url_path` is `request.url.path`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from api_plane import Plane, plane_settings, running_plane
from starlette.requests import Request

from aamp.api.guard import url_path
from aamp.store import store as store_module


@pytest.fixture(params=["sqlite", "postgresql"])
async def any_plane(request, tmp_path: Path) -> AsyncIterator[Plane]:  # type: ignore[no-untyped-def]
    extra: dict[str, str] = {}
    if request.param == "postgresql":
        server = request.getfixturevalue("postgres_server")
        url = server.create_database(f"t_{uuid.uuid4().hex[:12]}")
        extra["AAMP_DATABASE_URL"] = url.render_as_string(hide_password=False)
    async with running_plane(plane_settings(tmp_path, **extra)) as plane:
        assert plane.cp.store.dialect == request.param
        yield plane


def _count_statements(monkeypatch: pytest.MonkeyPatch, plane: Plane) -> list[str]:
    """Every read-plan statement the hot path runs from now on (SQL text, in order)."""
    seen: list[str] = []
    if plane.cp.store.dialect == "sqlite":
        real = store_module.LoopReader._rows

        def rows(self: Any, sql: str, params: dict[str, Any]) -> Any:
            seen.append(sql)
            return real(self, sql, params)

        monkeypatch.setattr(store_module.LoopReader, "_rows", rows)
    else:
        real_render = store_module.render

        def render(sql: str, driver: str) -> str:
            seen.append(sql)
            return real_render(sql, driver)

        monkeypatch.setattr(store_module, "render", render)
    return seen


async def test_an_agent_read_is_one_statement_and_nothing_of_it_is_kept(
    any_plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    plane = any_plane
    op_token = await plane.user("op", "operator")
    async with plane.client(plane.admin_token) as admin, plane.client(op_token) as op:
        agent = (await admin.post("/v1/agents", json={"name": "hot"})).json()
        grant = await admin.post(
            f"/v1/agents/{agent['id']}/grants", json={"user": "op", "level": "view"}
        )
        assert grant.status_code == 201

        seen = _count_statements(monkeypatch, plane)
        read = await op.get(f"/v1/agents/{agent['id']}")
        assert read.status_code == 200 and read.json() == agent
        assert plane.decision(read.headers["x-request-id"]) == "allow"
        assert len(seen) == 1 and "agents r ON r.id = :agent_id" in seen[0]

        # An admin asking for no such agent is allowed, then told it is not there.
        missing = await admin.get("/v1/agents/ag-000000000000")
        assert missing.status_code == 404
        assert plane.decision(missing.headers["x-request-id"]) == "allow"
        # An operator without a grant is refused whether the agent exists or not.
        assert (await op.get("/v1/agents/ag-000000000000")).status_code == 403

        removed = await admin.delete(f"/v1/agents/{agent['id']}/grants/{grant.json()['id']}")
        assert removed.status_code == 204
        denied = await op.get(f"/v1/agents/{agent['id']}")
        assert denied.status_code == 403
        assert plane.decision(denied.headers["x-request-id"]) == "deny"

        # Owned by the admin: deleted, it is gone from the next read.
        assert (await admin.get(f"/v1/agents/{agent['id']}")).status_code == 200
        assert (await admin.delete(f"/v1/agents/{agent['id']}")).status_code == 204
        assert (await admin.get(f"/v1/agents/{agent['id']}")).status_code == 404

        tokens = (await admin.get("/v1/tokens")).json()
        op_token_id = next(t["id"] for t in tokens if t["username"] == "op")
        assert (await admin.delete(f"/v1/tokens/{op_token_id}")).status_code in (200, 204)
        revoked = await op.get(f"/v1/agents/{agent['id']}")
        assert revoked.status_code == 401 and "revoked" in revoked.json()["message"]
        assert plane.decision(revoked.headers["x-request-id"]) == "deny"


async def test_with_a_session_the_resolver_reads_the_agent(plane: Plane) -> None:
    await plane.user("bob", "builder", "bob-password-123")
    async with plane.client() as browser, plane.client(plane.admin_token) as admin:
        signed_in = await browser.post(
            "/v1/session", json={"username": "bob", "password": "bob-password-123"}
        )
        assert signed_in.status_code in (200, 201)
        csrf = {"x-csrf-token": signed_in.json()["csrf_token"]}
        made = await browser.post("/v1/agents", json={"name": "bobs"}, headers=csrf)
        assert made.status_code == 201
        read = await browser.get(f"/v1/agents/{made.json()['id']}")
        assert read.status_code == 200 and read.json() == made.json()
        assert plane.decision(read.headers["x-request-id"]) == "allow"
        assert (await browser.get("/v1/agents/ag-000000000000")).status_code == 403
        assert (await admin.get("/v1/agents/ag-000000000000")).status_code == 404


@pytest.mark.parametrize(
    "path",
    ["/v1/agents/x", "/a?b#c\\d", "/a\tb\nc\rd", "/é/ü", "//x", "/a%20b", "/ x", "/\x00\x1b\x7f"],
)
def test_url_path_is_what_starlette_gives(path: str) -> None:
    for extra in ({"headers": [(b"host", b"example:8443")]}, {"server": ("127.0.0.1", 80)}):
        request = Request(
            {"type": "http", "path": path, "headers": [], "query_string": b"a=1"} | extra
        )
        assert url_path(request) == request.url.path
