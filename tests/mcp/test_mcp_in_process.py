"""`/mcp`'s tools reach the API of their own process in process (`aamp.mcp.in_process`): a
tool call works with nothing listening at the API's address, passes the API's guard and
leaves its audit record; and the connection behaves as a socket would for the SDK — a
refusal is the API's `code` and `message`, a header or method the socket would refuse to
send is refused the same way (`transport.outgoing`), a reader that leaves early or times out is a
client gone (`http.disconnect`), and the app cannot run ahead of a slow reader."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api"))
import httpx
from api_plane import plane_settings, running_plane  # tests/api
from test_mcp_auth import MCP_HEADERS, mcp_site  # tests/mcp

from aamp.client import Client, ClientError
from aamp.client.transport import Connection
from aamp.mcp import on_loop
from aamp.mcp.in_process import WINDOW, AsgiConnection

NOTHING_LISTENS = "http://127.0.0.1:9"


async def test_a_tool_call_reaches_the_api_in_process_through_its_guard(tmp_path: Path) -> None:
    async with running_plane(plane_settings(tmp_path)) as plane, mcp_site(plane) as site:
        olga = await plane.user("olga", "operator")
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "sandbox_list", "arguments": {}},
        }
        transport = httpx.ASGITransport(app=site)
        async with httpx.AsyncClient(transport=transport, base_url=NOTHING_LISTENS) as c:
            answer = await c.post(
                "/mcp", json=call, headers={**MCP_HEADERS, "authorization": f"Bearer {olga}"}
            )
        assert answer.status_code == 200, answer.text
        result = answer.json()["result"]
        assert not result["isError"], result
        assert result["structuredContent"] == {"sandboxes": []}
        async with plane.client(plane.admin_token) as admin:
            page = await admin.get(
                "/v1/audit", params={"actor": "user:olga", "action": "sandbox.list"}
            )
        (record,) = page.json()["records"]
        assert record["decision"] == "allow" and record["request_id"].startswith("req-")


async def test_a_tool_call_needs_no_worker_thread(tmp_path: Path) -> None:
    """The SDK's code runs on the loop itself over the in-process connection: a tool call
    answers while every worker thread the loop could hand it to is taken."""
    async with running_plane(plane_settings(tmp_path)) as plane, mcp_site(plane) as site:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        release = threading.Event()
        taken = loop.run_in_executor(None, release.wait)
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "sandbox_list", "arguments": {}},
        }
        headers = {**MCP_HEADERS, "authorization": f"Bearer {plane.admin_token}"}
        transport = httpx.ASGITransport(app=site)
        try:
            async with httpx.AsyncClient(transport=transport, base_url=NOTHING_LISTENS) as c:
                answer = await asyncio.wait_for(c.post("/mcp", json=call, headers=headers), 10)
        finally:
            release.set()
            await taken
        result = answer.json()["result"]
        assert not result["isError"] and result["structuredContent"] == {"sandboxes": []}


class StreamingApp:
    """An ASGI app that answers `status` and then streams numbered chunks until told the
    client is gone (or `chunks` are sent); it notes how far it got."""

    def __init__(self, status: int = 200, chunks: int = 10_000, answer: bool = True) -> None:
        self.status, self.chunks, self.answer = status, chunks, answer
        self.sent = 0
        self.disconnected = asyncio.Event()
        self.scope: dict[str, Any] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scope = scope
        request = await receive()
        assert request["type"] == "http.request"

        async def watch() -> None:
            if (await receive())["type"] == "http.disconnect":
                self.disconnected.set()

        watcher = asyncio.create_task(watch())
        if not self.answer:
            await self.disconnected.wait()
            return
        if self.status != 200:
            body = b'{"code": "forbidden", "message": "not yours"}'
            await send({"type": "http.response.start", "status": self.status, "headers": []})
            await send({"type": "http.response.body", "body": body})
            watcher.cancel()
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            for n in range(self.chunks):
                await send({"type": "http.response.body", "body": b"%d\n" % n, "more_body": True})
                self.sent += 1
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            pass  # the reader is gone
        await watcher


def _client(app: Any, timeout: float = 5) -> Client:
    def connect(base: str, headers: dict[str, str], *, timeout: float | None) -> AsgiConnection:
        return AsgiConnection(app, base, headers, timeout=timeout)

    return Client(NOTHING_LISTENS, "a-token", timeout=timeout, connection=connect)


async def test_a_refusal_is_the_apis_code_and_message() -> None:
    app = StreamingApp(status=403)
    client = _client(app)
    with pytest.raises(ClientError) as refused:
        await on_loop.run(client.call, "GET", "/v1/things/a b", params={"q": "1"})
    assert (refused.value.code, refused.value.message, refused.value.status) == (
        "forbidden",
        "not yours",
        403,
    )
    headers = dict(app.scope["headers"])
    assert headers[b"authorization"] == b"Bearer a-token"
    assert app.scope["path"] == "/v1/things/a b" and app.scope["query_string"] == b"q=1"


async def test_a_reader_that_leaves_is_a_client_gone_and_is_never_outrun() -> None:
    app = StreamingApp()
    client = _client(app)

    def read_two_then_pause_then_leave() -> tuple[list[str], int]:
        with client.stream("GET", "/v1/stream") as resp:
            lines = resp.iter_lines()
            first = [next(lines), next(lines)]
            on_loop.wait(asyncio.sleep(0.3))  # the app may run ahead only by the window
            ahead = app.sent
        return first, ahead

    first, ahead = await on_loop.run(read_two_then_pause_then_leave)
    assert first == ["0", "1"]
    assert ahead <= 2 + WINDOW + 1, ahead
    await asyncio.wait_for(app.disconnected.wait(), 5)
    assert app.sent < app.chunks


async def test_an_app_that_does_not_answer_times_out_and_is_left() -> None:
    app = StreamingApp(answer=False)
    client = _client(app, timeout=0.2)
    with pytest.raises(ClientError) as late:
        await on_loop.run(client.call, "GET", "/v1/slow")
    assert late.value.code == "timed_out"
    await asyncio.wait_for(app.disconnected.wait(), 5)


@pytest.mark.parametrize(
    ("token", "method", "headers"),
    [
        ("a-token", "GET", {"x-note": "a\r\nx-injected: yes"}),
        ("a-token", "GET", {"x-note": "a\0b"}),
        ("a-token", "GET", {"x-bad\nname": "v"}),
        ("a-token\r\nx-injected: yes", "GET", {}),  # a token file with a line break in it
        ("a-token", "GET /v1/other HTTP/1.1\r\nx-injected: yes\r\n\r\nGET", {}),
        ("a-token", "G3T", {}),
    ],
)
async def test_what_a_socket_cannot_send_is_refused_the_same_way_in_process(
    token: str, method: str, headers: dict[str, str]
) -> None:
    # The app would answer anything with a refusal of its own: what the test sees must be
    # the client's refusal, made before the app is called.
    app = StreamingApp(status=403)
    base = {"authorization": f"Bearer {token}"}
    in_process = AsgiConnection(app, NOTHING_LISTENS, base, timeout=5)
    on_socket = Connection(NOTHING_LISTENS, base, timeout=5)  # refused before it connects
    refusals = []
    for connection, run in ((in_process, on_loop.run), (on_socket, asyncio.to_thread)):
        with pytest.raises(ClientError) as refused:
            await run(connection.send, method, "/v1/things", headers=headers)
        refusals.append((refused.value.code, refused.value.message))
    assert refusals[0] == refusals[1], refusals
    assert refusals[0][0] == "bad_request"
    assert app.scope == {}  # the app never heard of the request
