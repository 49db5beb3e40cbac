"""`/mcp`'s guard against DNS rebinding, a setting (`AAMP_MCP_ALLOWED_HOSTS`) that defaults
safe: by default only the loopback names and the listening address are answered; a reverse
proxy's name is answered once it is listed; any other `Host` is 421, a page of another
`Origin` 403, each naming the setting and recorded as `mcp.connect` denied with its actor;
a value that is not a host stops the control plane from starting."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api"))
from api_plane import Plane, plane_settings, running_plane  # tests/api
from test_mcp_auth import LIST_TOOLS, MCP_HEADERS, mcp_site  # tests/mcp

from aamp.config import ConfigError, Settings
from aamp.mcp import with_mcp
from aamp.mcp.hosts import HOSTS_ENV, allowed_hosts


async def _list_tools(site: Any, token: str, **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=site)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8700") as c:
        sent = {**MCP_HEADERS, "authorization": f"Bearer {token}", **headers}
        return await c.post("/mcp", json=LIST_TOOLS, headers=sent)


async def _connect_refusals(plane: Plane) -> list[dict[str, Any]]:
    async with plane.client(plane.admin_token) as admin:
        page = await admin.get("/v1/audit", params={"action": "mcp.connect"})
    return page.json()["records"]


async def test_by_default_only_loopback_hosts_and_origins_are_answered(tmp_path: Path) -> None:
    async with running_plane(plane_settings(tmp_path)) as plane, mcp_site(plane) as site:
        olga = await plane.user("olga", "operator")
        for host in ("127.0.0.1:8700", "localhost:9", "[::1]:8700"):
            ok = await _list_tools(site, olga, host=host, origin=f"http://{host}")
            assert ok.status_code == 200, (host, ok.text)

        proxied = await _list_tools(site, olga, host="aamp.example.test")
        assert proxied.status_code == 421, proxied.text
        assert proxied.json()["code"] == "host_not_allowed"
        assert HOSTS_ENV in proxied.json()["message"]
        page = await _list_tools(site, olga, origin="http://evil.test")
        assert page.status_code == 403 and page.json()["code"] == "origin_not_allowed"
        assert "result" not in proxied.json() and "result" not in page.json()

        records = await _connect_refusals(plane)
        assert [(r["actor"], r["decision"]) for r in records] == [("user:olga", "deny")] * 2
        assert "aamp.example.test" in records[0]["reason"]
        assert "evil.test" in records[1]["reason"]


async def test_a_listed_proxy_name_is_answered_and_only_it(tmp_path: Path) -> None:
    settings = plane_settings(tmp_path, **{HOSTS_ENV: "AAMP.example.test, proxy.example.test:*"})
    async with running_plane(settings) as plane, mcp_site(plane) as site:
        olga = await plane.user("olga", "operator")
        for host, origin in (
            ("aamp.example.test", "https://aamp.example.test"),
            ("proxy.example.test:8443", "https://proxy.example.test"),
            ("proxy.example.test", None),
        ):
            headers = {"host": host, **({"origin": origin} if origin else {})}
            ok = await _list_tools(site, olga, **headers)
            assert ok.status_code == 200, (host, ok.text)
        for host in ("127.0.0.1:8700", "aamp.example.test:8443", "evil.aamp.example.test"):
            refused = await _list_tools(site, olga, host=host)
            assert refused.status_code == 421, (host, refused.text)


def test_the_default_follows_the_listening_address_and_a_bad_value_is_refused(
    tmp_path: Path,
) -> None:
    def hosts(**env: str) -> tuple[str, ...]:
        return allowed_hosts(Settings.from_env({"AAMP_HOME": str(tmp_path), **env}))

    loopback = ("127.0.0.1:*", "localhost:*", "[::1]:*")
    assert hosts() == (*loopback, "127.0.0.1:8700")
    assert hosts(AAMP_HOST="10.1.2.3", AAMP_PORT="9000") == (*loopback, "10.1.2.3:9000")
    assert hosts(AAMP_HOST="0.0.0.0") == loopback  # a wildcard is no name: list yours
    assert hosts(AAMP_HOST="fd00::5") == (*loopback, "[fd00::5]:8700")
    for bad in ("https://aamp.example.test", "aamp.example.test/mcp", "a b", "x,", "*"):
        with pytest.raises(ConfigError, match=HOSTS_ENV):
            hosts(**{HOSTS_ENV: bad})


async def test_the_control_plane_does_not_start_with_a_bad_setting(tmp_path: Path) -> None:
    settings = plane_settings(tmp_path, **{HOSTS_ENV: "http://aamp.example.test"})
    async with running_plane(settings) as plane:
        with pytest.raises(ConfigError, match="without http://"):
            with_mcp(plane.app, plane.cp, "http://127.0.0.1:8700")
