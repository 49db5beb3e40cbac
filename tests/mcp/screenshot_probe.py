"""Run under `unshare -n` by test_mcp_screenshot.py: a private network namespace whose only
interface is `lo`, a web page on 127.0.0.10:80 named `app.test`, and the whole control plane
in this process (real store, audit log, gVisor sandboxes from the browser image, `/mcp` and
the API served by uvicorn on loopback). The official MCP client, with an admin's token, asks
`browser_screenshot` for the page (a one-shot sandbox from the agent's browser policy, which
allows `app.test` only), then for `blocked.test` in a sandbox of its own. Prints one JSON
report: the tools' answers, what the web server received, the audit records of the
screenshots and of the egress decisions.

Usage: python screenshot_probe.py SETTINGS_JSON
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # tests/

from aamp.client import AsyncClient, ClientError  # noqa: E402
from aamp.config import Settings  # noqa: E402
from aamp.egress.resolver import StaticResolver  # noqa: E402
from aamp.mcp import with_mcp  # noqa: E402
from aamp.sandbox.gvisor import GVisorDriver  # noqa: E402
from aamp.server import build_control_plane  # noqa: E402
from aamp.web import create_site  # noqa: E402

APP_ADDRESS = "127.0.0.10"
PUBLIC = "1.1.1.1"  # a would-be outside host, on this namespace's loopback
PAGE = b"""<!doctype html><html><head><title>Quarterly numbers</title></head>
<body style="background:#2050c0;color:white"><h1>Revenue 42</h1></body></html>"""
POLICY = {
    "name": "browse",
    "image": "browser",
    "egress": {"default": "block", "allow": ["app.test"]},
    "lifetime": {"ttl": "10m", "idle": "5m"},
}


class PageServerForTests(ThreadingHTTPServer):
    """The web app the sandbox's browser is pointed at; keeps the paths it was asked for."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.paths.append(self.path)
                self.send_response(200 if self.path == "/" else 404)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(PAGE)))
                self.end_headers()
                self.wfile.write(PAGE)

            def log_message(self, *_: object) -> None:
                pass

        super().__init__((APP_ADDRESS, 80), Handler)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answer(result: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"is_error": result.is_error, "content": []}
    for item in result.content:
        if item.type == "image":
            png = base64.b64decode(item.data)
            out["content"].append({"type": "image", "mime_type": item.mime_type, "png": png.hex()})
        else:
            out["content"].append({"type": item.type, "text": item.text})
    return out


async def scenario(settings: Settings) -> dict[str, Any]:
    cp, _ = build_control_plane(settings, {"gvisor": GVisorDriver(settings.runtime_dir)})
    cp.manager.resolver = StaticResolver({"app.test": [APP_ADDRESS], "blocked.test": [PUBLIC]})
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    site = with_mcp(create_site(cp), cp, url)
    server = uvicorn.Server(uvicorn.Config(site, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    token = settings.cli_token_path.read_text().strip()
    report: dict[str, Any] = {}
    try:
        async with AsyncClient(url, token) as admin:
            agent = (await admin.call("POST", "/v1/agents", json={"name": "browsing"}))["id"]
            await admin.call("PUT", "/v1/policies/browse", json=POLICY)
            for kind, name in (("policy", "browse"), ("image", "browser")):
                body = {"kind": kind, "name": name}
                await admin.call("POST", f"/v1/agents/{agent}/resources", json=body)
            http = httpx2.AsyncClient(
                headers={"authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(300)
            )
            async with McpClient(streamable_http_client(f"{url}/mcp", http_client=http)) as mcp:
                shot = await mcp.call_tool(
                    "browser_screenshot",
                    {"url": "http://app.test/", "agent": agent, "policy": "browse"},
                )
                report["shot"] = _answer(shot)
                report["left_after_one_shot"] = (
                    await mcp.call_tool("sandbox_list", {})
                ).structured_content
                made = await mcp.call_tool("sandbox_create", {"agent": agent, "policy": "browse"})
                sandbox = made.structured_content["id"]
                blocked = await mcp.call_tool(
                    "browser_screenshot", {"url": "http://blocked.test/", "sandbox_id": sandbox}
                )
                report["blocked"] = _answer(blocked)
                await mcp.call_tool("sandbox_destroy", {"sandbox_id": sandbox})
            page = await admin.call("GET", "/v1/audit", params={"limit": "1000"})
            report["audit"] = page["records"]
            # The SDK's twin of the tool (after the audit read above, which counts the tool's).
            async with await admin.sandboxes.create(agent=agent, policy="browse") as browser:
                taken = await browser.screenshot("http://app.test/")
                report["sdk_shot"] = {
                    "png": taken.png.hex(),
                    **{k: getattr(taken, k) for k in ("sha256", "title", "status", "url")},
                }
                try:
                    await browser.screenshot("http://blocked.test/")
                    report["sdk_blocked"] = None
                except ClientError as exc:
                    report["sdk_blocked"] = {"code": exc.code, "message": exc.message}
    finally:
        server.should_exit = True
        await serving
        cp.store.close()
    return report


def main() -> None:
    settings = json.loads(sys.argv[1])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for address in (APP_ADDRESS, PUBLIC):
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    pages = PageServerForTests()
    threading.Thread(target=pages.serve_forever, daemon=True).start()
    try:
        report = asyncio.run(scenario(Settings.from_env(settings)))
    finally:
        pages.shutdown()
    report["received"] = pages.paths
    print(json.dumps(report))


if __name__ == "__main__":
    main()
