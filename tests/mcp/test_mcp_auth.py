"""`/mcp` from the untrusted side: no request reaches MCP (not even `tools/list`) without a
usable API token, and each refusal is in the audit log like the API's refused credentials —
with whom a revoked token or a disabled user's token names. In process (`with_mcp` around an
in-process control plane that boots nothing); the kept SDK clients are checked too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api"))
from api_plane import Plane, plane_settings, running_plane  # tests/api

from aamp.mcp import with_mcp
from aamp.mcp.clients import TokenClients

LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
MCP_HEADERS = {"accept": "application/json, text/event-stream"}


def _already_started(plane: Plane) -> Any:
    """The plane's API app, whose lifespan `running_plane` already runs."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await plane.app(scope, receive, send)  # type: ignore[operator]
            return
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})

    return app


@contextlib.asynccontextmanager
async def mcp_site(plane: Plane) -> AsyncIterator[Any]:
    """`with_mcp` around the plane, its lifespan (the MCP session manager's) running."""
    site = with_mcp(_already_started(plane), plane.cp, "http://127.0.0.1:9")
    started, stopping = asyncio.Event(), asyncio.Event()
    sent = iter(({"type": "lifespan.startup"},))

    async def receive() -> dict[str, str]:
        for message in sent:
            return message
        await stopping.wait()
        return {"type": "lifespan.shutdown"}

    async def send(message: dict[str, str]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    task = asyncio.create_task(site({"type": "lifespan"}, receive, send))
    await started.wait()
    try:
        yield site
    finally:
        stopping.set()
        await task


async def _post(site: Any, headers: dict[str, str], path: str = "/mcp") -> httpx.Response:
    transport = httpx.ASGITransport(app=site)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8700") as c:
        return await c.post(path, json=LIST_TOOLS, headers={**MCP_HEADERS, **headers})


async def _refusals(plane: Plane) -> list[dict[str, Any]]:
    async with plane.client(plane.admin_token) as admin:
        page = await admin.get("/v1/audit", params={"action": "mcp.connect"})
    return page.json()["records"]


async def test_mcp_refuses_every_request_without_a_usable_token(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    async with running_plane(plane_settings(tmp_path)) as plane, mcp_site(plane) as site:
        cp = plane.cp
        olga = await plane.user("olga", "operator")
        dan = await plane.user("dan", "operator")
        _, revoked = await cp.store.run(lambda: cp.directory.create_token("olga", "old"))
        async with plane.client(revoked) as c:
            listed = (await c.get("/v1/tokens")).json()
            token_id = next(t["id"] for t in listed if t["name"] == "old")
            assert (await c.delete(f"/v1/tokens/{token_id}")).status_code == 200
        async with plane.client(plane.admin_token) as admin:
            assert (await admin.patch("/v1/users/dan", json={"disabled": True})).status_code == 200
        async with plane.client(plane.admin_token) as admin:
            session = await admin.post(
                "/v1/session", json={"username": "admin", "password": "admin-password-for-tests"}
            )
        assert session.status_code == 200, session.text
        cookie = session.cookies["aamp_session"]  # a UI session does not count at /mcp

        # A usable token lists the tools: what every refusal below is refused.
        ok = await _post(site, {"authorization": f"Bearer {olga}"})
        assert ok.status_code == 200, ok.text
        assert "sandbox_exec" in {t["name"] for t in ok.json()["result"]["tools"]}
        # ... and costs no log line: the MCP SDK's per-request INFO lines are kept out.
        chatter = [r for r in caplog.records if r.name.startswith("mcp") and r.levelno < 30]
        assert chatter == [], [r.getMessage() for r in chatter]

        cases = [
            ({}, "needs an API token", "anonymous"),
            ({"authorization": "Bearer aamp_not-a-token"}, "not valid", "anonymous"),
            ({"authorization": f"Basic {olga}"}, "must be 'Bearer", "anonymous"),
            ({"authorization": "Bearer " + "x" * 300}, "not valid", "anonymous"),
            ({"authorization": f"Bearer {revoked}"}, "revoked", "user:olga"),
            ({"authorization": f"Bearer {dan}"}, "disabled", "user:dan"),
            ({"cookie": f"aamp_session={cookie}"}, "needs an API token", "anonymous"),
        ]
        for headers, said, _ in cases:
            refused = await _post(site, headers)
            assert refused.status_code == 401, (headers, refused.text)
            assert refused.json()["code"] == "unauthenticated"
            assert said in refused.json()["message"], refused.json()
            assert refused.headers["www-authenticate"] == "Bearer"
            assert "result" not in refused.json()
        records = await _refusals(plane)
        assert [(r["actor"], r["decision"]) for r in records] == [
            (actor, "deny") for *_, actor in cases
        ]
        for record, (_, said, _) in zip(records, cases, strict=True):
            assert said in record["reason"]
            assert record["details"]["path"] == "/mcp" and record["request_id"].startswith("req-")
        assert records[4]["details"]["token"] == token_id  # the revoked token, by its id


async def test_only_mcp_itself_is_served_and_paths_under_it_are_guarded(tmp_path: Path) -> None:
    """/mcp is handed to the MCP SDK's session manager itself (not its Starlette app, whose
    router kept to /mcp and sent /mcp/ there): a path under /mcp is still refused without a
    token, and answered 404 with one, never by MCP; /mcp/ is served as /mcp."""
    async with running_plane(plane_settings(tmp_path)) as plane, mcp_site(plane) as site:
        olga = await plane.user("olga", "operator")
        paths = ("/mcp/", "/mcp/messages", "/mcp/x/y")
        for path in paths:
            refused = await _post(site, {}, path)
            assert refused.status_code == 401, (path, refused.text)
            assert refused.json()["code"] == "unauthenticated"
        for path in paths[1:]:
            missing = await _post(site, {"authorization": f"Bearer {olga}"}, path)
            assert missing.status_code == 404, (path, missing.text)
            assert missing.json() == {"code": "not_found", "message": "MCP is served at /mcp only"}
        for path in ("/mcp", "/mcp/"):
            ok = await _post(site, {"authorization": f"Bearer {olga}"}, path)
            assert ok.status_code == 200 and "sandbox_exec" in ok.text, (path, ok.text)
        records = await _refusals(plane)
        assert [r["details"]["path"] for r in records] == list(paths)


async def test_kept_clients_are_per_token_bounded_and_dropped() -> None:
    clients = TokenClients("http://127.0.0.1:9", limit=2)
    a, b = await clients.get("token-a"), await clients.get("token-b")
    assert a is await clients.get("token-a") and a is not b
    await clients.get("token-c")  # b is the least recently used: closed and gone
    assert len(clients) == 2 and b is not await clients.get("token-b")
    await clients.drop("token-b")
    assert len(clients) == 1 and (await clients.get("token-b")) is not b
    idle = TokenClients("http://127.0.0.1:9", idle_seconds=0)
    first = await idle.get("token-a")
    assert first is not await idle.get("token-a")  # closed once idle, a new one made
    await clients.close()
    await idle.close()
    assert len(clients) == 0
