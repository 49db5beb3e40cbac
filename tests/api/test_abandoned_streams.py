"""A download or exec the client abandons must not keep its sandbox busy.

`GET /v1/sandboxes/{id}/files` borrows the sandbox (`manager.use`) for as long as the file
streams out; while borrowed the sandbox never idle-expires. A client that goes away — before the
first byte, right after the headers, or half-way through a 100 MiB body — must give the sandbox
back at once, so that `lifetime.idle` still destroys it and nothing of it remains.

An in-process ASGI client never disconnects early, so these tests run uvicorn on 127.0.0.1
(in this event loop, so the manager can be inspected) and talk to it through raw TCP sockets
that they close at the chosen moment; the one window too narrow to hit with a socket is driven
through the app's ASGI interface with the disconnect already waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from aamp.api.app import create_app
from aamp.api.context import ControlPlane
from aamp.config import Settings
from aamp.sandbox import procs
from aamp.sandbox.gvisor import GVisorDriver
from aamp.server import build_control_plane

pytestmark = [pytest.mark.usefixtures("base_image"), pytest.mark.timeout(120)]

ADMIN_PASSWORD = "admin-password-for-tests"
IDLE_SECONDS = 3
BIG_MIB = 100
POLICY = f"""\
name: download-abandoned
image: base
lifetime: {{ttl: 10m, idle: {IDLE_SECONDS}s}}
data: {{outbound: {{max_bytes: {BIG_MIB + 1}MiB, types: [bin]}}}}
"""


@dataclass
class LivePlane:
    cp: ControlPlane
    app: Any
    port: int
    token: str

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"authorization": f"Bearer {self.token}"},
            timeout=120,
        )


@pytest.fixture
async def live(settings: Settings) -> AsyncIterator[LivePlane]:
    """The real control plane served by uvicorn on a loopback port of its own."""
    env = {**settings.env, "AAMP_ADMIN_PASSWORD": ADMIN_PASSWORD}
    s = Settings.from_env(env)
    cp, _ = build_control_plane(s, {"gvisor": GVisorDriver(s.runtime_dir)})
    cp.manager.tick = 0.1
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(cp)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert not task.done(), "the server stopped while starting"
            assert time.monotonic() < deadline, "the server did not start within 30 s"
            await asyncio.sleep(0.05)
        yield LivePlane(cp, app, port, s.cli_token_path.read_text().strip())
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
        sock.close()
        cp.store.close()


async def _sandbox_with_big_file(live: LivePlane) -> str:
    async with live.client() as c:
        r = await c.post("/v1/sandboxes", json={"policy_document": POLICY})
        assert r.status_code == 201, r.text
        sandbox_id = r.json()["id"]
        assert r.json()["idle_seconds"] == IDLE_SECONDS
        script = f"head -c {BIG_MIB}M /dev/zero > /workspace/big.bin"
        r = await c.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": ["sh", "-c", script]})
        assert r.status_code == 200, r.text
        assert r.text.splitlines()[-1].startswith('{"exit_code":0'), r.text
    return sandbox_id


def _request(live: LivePlane, sandbox_id: str) -> bytes:
    return (
        f"GET /v1/sandboxes/{sandbox_id}/files?path=big.bin HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{live.port}\r\n"
        f"Authorization: Bearer {live.token}\r\n"
        "Connection: keep-alive\r\n\r\n"
    ).encode()


async def _abandon(live: LivePlane, sandbox_id: str, when: str) -> int:
    """Start a download over a raw socket and drop it at `when`; the body bytes read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
    sock = writer.get_extra_info("socket")
    writer.write(_request(live, sandbox_id))
    await writer.drain()
    got = 0
    if when in ("headers", "mid-body"):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        assert f"content-length: {BIG_MIB * 1024 * 1024}".encode() in head.lower()
    if when == "mid-body":
        while got < 8 * 1024 * 1024:
            chunk = await asyncio.wait_for(reader.read(1 << 16), 30)
            assert chunk, "the server ended the body early"
            got += len(chunk)
    if when == "reset":
        # RST instead of FIN: the server's next read fails instead of seeing end-of-file.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return got


async def _wait_for(predicate, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


def _runsc_pids(settings: Settings, sandbox_id: str) -> list[int]:
    return procs.pids_matching(f"--root={settings.runtime_dir}/runsc", sandbox_id)


@pytest.mark.parametrize("when", ["at-once", "reset", "headers", "mid-body"])
async def test_abandoned_download_frees_the_sandbox_and_idle_expires(
    live: LivePlane, when: str
) -> None:
    manager = live.cp.manager
    settings = live.cp.settings
    sandbox_id = await _sandbox_with_big_file(live)
    sandbox = manager.get(sandbox_id)
    assert _runsc_pids(settings, sandbox_id), "no runsc process for a live sandbox"

    # Three downloads dropped at the same point: each must give the sandbox back.
    for _ in range(3):
        await _abandon(live, sandbox_id, when)
    freed = await _wait_for(lambda: sandbox.active_uses == 0, 5)
    assert freed, f"sandbox still busy ({sandbox.active_uses} uses) after abandoned downloads"

    # The guest connections that carried them are closed too, not left open with the guest
    # agent blocked sending the rest (the channel allows only so many).
    open_conns = await _wait_for(lambda: not sandbox.channel._active, 5)
    assert open_conns, f"{len(sandbox.channel._active)} guest connections left open"

    # Still usable: a complete download of the same file gives every byte.
    path = f"/v1/sandboxes/{sandbox_id}/files?path=big.bin"
    async with live.client() as c, c.stream("GET", path) as r:
        assert r.status_code == 200
        total = 0
        async for chunk in r.aiter_raw():
            assert chunk.count(0) == len(chunk)
            total += len(chunk)
    assert total == BIG_MIB * 1024 * 1024
    assert sandbox.active_uses == 0

    # Nobody uses it now: `lifetime.idle` destroys it, and its processes go with it.
    gone = await _wait_for(
        lambda: sandbox_id not in {s.id for s in manager.list()}, IDLE_SECONDS + 10
    )
    assert gone, f"sandbox not idle-expired (active_uses={sandbox.active_uses})"
    assert await _wait_for(lambda: not _runsc_pids(settings, sandbox_id), 10), "runsc left behind"
    assert not (settings.runtime_dir / "sb" / sandbox_id).exists()
    async with live.client() as c:
        r = await c.get("/v1/audit", params={"resource": f"sandbox:{sandbox_id}", "limit": 1000})
    assert r.status_code == 200, r.text
    records = r.json()["records"]
    destroyed = [x["reason"] for x in records if x["action"] == "sandbox.destroy"]
    assert destroyed == ["idle"]
    # Each abandoned download is on record as an incomplete transfer.
    failed = [x for x in records if x["action"] == "sandbox.file_out" and x["decision"] == "error"]
    assert len(failed) == 3, [(x["action"], x["decision"]) for x in records]


async def test_a_client_gone_before_the_response_starts_frees_the_sandbox(live: LivePlane) -> None:
    """The narrowest window: the client is gone before the response starts. uvicorn speaks ASGI
    2.3, so Starlette races the body against `http.disconnect`; with the disconnect already
    waiting and a server that pauses to drain its write buffer on the response's first message,
    the body is cancelled before its first line runs."""
    sandbox_id = await _sandbox_with_big_file(live)
    sandbox = live.cp.manager.get(sandbox_id)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/v1/sandboxes/{sandbox_id}/files",
        "raw_path": f"/v1/sandboxes/{sandbox_id}/files".encode(),
        "query_string": b"path=big.bin",
        "root_path": "",
        "headers": [
            (b"host", f"127.0.0.1:{live.port}".encode()),
            (b"authorization", f"Bearer {live.token}".encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", live.port),
    }

    async def gone() -> dict[str, str]:
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        await asyncio.sleep(0.01)  # a server waiting for its write buffer to drain

    for _ in range(3):
        await live.app(scope, gone, send)
    assert await _wait_for(lambda: sandbox.active_uses == 0, 5), (
        f"sandbox still busy ({sandbox.active_uses} uses) after downloads nobody received"
    )
    assert await _wait_for(lambda: not sandbox.channel._active, 5), "guest connections left open"
    async with live.client() as c:
        r = await c.get("/v1/audit", params={"resource": f"sandbox:{sandbox_id}", "limit": 1000})
    records = r.json()["records"]
    failed = [x for x in records if x["action"] == "sandbox.file_out" and x["decision"] == "error"]
    assert len(failed) == 3, [(x["action"], x["decision"]) for x in records]


async def test_an_abandoned_exec_stops_the_guest_command(live: LivePlane) -> None:
    """A client that goes away in the middle of `POST .../exec` (Ctrl-C on `aamp sandbox exec`)
    must not leave the command running in the guest or the sandbox borrowed."""
    sandbox_id = await _sandbox_with_big_file(live)
    sandbox = live.cp.manager.get(sandbox_id)
    body = json.dumps({"argv": ["sh", "-c", "echo started; exec sleep 1234"]}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
    writer.write(
        (
            f"POST /v1/sandboxes/{sandbox_id}/exec HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{live.port}\r\n"
            f"Authorization: Bearer {live.token}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
    )
    await writer.drain()
    seen = b""
    while b'"stream":"stdout"' not in seen:
        chunk = await asyncio.wait_for(reader.read(4096), 30)
        assert chunk, seen
        seen += chunk
    gc.disable()  # the cyclic collector may not stand in for the clean-up
    try:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        assert await _wait_for(lambda: sandbox.active_uses == 0, 5), "sandbox still borrowed"
        deadline = time.monotonic() + 5
        while True:
            async with live.cp.manager.use(sandbox_id) as channel:
                _, out, _ = await channel.run(
                    ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]
                )
            if b"sleep 1234" not in out or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    finally:
        gc.enable()
    assert b"sleep 1234" not in out, "the guest command outlived the request"
