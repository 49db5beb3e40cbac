"""The client address the login throttle counts and the audit log records is the connection's,
unless it comes from a proxy named in AAMP_TRUSTED_PROXIES: a client of a loopback listener
(every client, on one machine) that names another address in `X-Forwarded-For` does not
escape the per-address limit (20 failures in 5 minutes) or choose what is recorded. Served by
the product's own uvicorn configuration (`server.http_config`) on a real socket."""

from __future__ import annotations

import asyncio
import json
import socket
from contextlib import asynccontextmanager

import httpx
import pytest
import uvicorn
from sqlalchemy import text

from aamp.config import Settings
from aamp.server import http_config, trusted_proxies


@asynccontextmanager
async def served(plane, **env: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings.from_env({**plane.cp.settings.env, "AAMP_PORT": str(port), **env})
    config = http_config(plane.app, settings)
    config.lifespan = "off"  # the plane fixture already runs the app's start-up
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            yield client
    finally:
        server.should_exit = True
        await task


async def _spray(client: httpx.AsyncClient, start: int) -> list[int]:
    statuses = []
    for i in range(start, start + 25):  # past the per-address limit of 20
        r = await client.post(
            "/v1/session",
            json={"username": f"user{i}", "password": "wrong-password-1"},
            headers={"x-forwarded-for": f"203.0.113.{i}"},
        )
        statuses.append(r.status_code)
    return statuses


def _recorded_addresses(plane) -> set[str]:
    with plane.cp.store.engine.connect() as conn:
        rows = conn.execute(text("SELECT details FROM audit_records WHERE action='login'")).all()
    return {json.loads(d)["address"] for (d,) in rows}


async def test_a_client_does_not_choose_its_address(plane) -> None:
    async with served(plane) as client:
        statuses = await _spray(client, 0)
    assert statuses[:20] == [401] * 20 and set(statuses[20:]) == {429}, statuses
    assert _recorded_addresses(plane) == {"127.0.0.1"}


async def test_a_trusted_proxy_names_the_client(plane) -> None:
    async with served(plane, AAMP_TRUSTED_PROXIES="127.0.0.1") as client:
        statuses = await _spray(client, 100)
    assert set(statuses) == {401}, statuses  # each named client failed once
    assert "203.0.113.100" in _recorded_addresses(plane)


def test_a_bad_trusted_proxy_is_refused_naming_it() -> None:
    settings = Settings.from_env({"AAMP_TRUSTED_PROXIES": "10.0.0.1, proxy.internal"})
    with pytest.raises(ValueError, match=r"'proxy\.internal' is not an IP address or network"):
        trusted_proxies(settings)
    fine = Settings.from_env({"AAMP_TRUSTED_PROXIES": "10.0.0.1, 192.168.0.0/24"})
    assert trusted_proxies(fine) == ["10.0.0.1/32", "192.168.0.0/24"]
