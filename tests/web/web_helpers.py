"""`Site`: the API and the UI of an in-process control plane, and browser-like clients of it
(`browser()`: cookies kept, the site's own Origin on every form post, as a browser sends);
`served`: an app on a loopback port for a real browser, and `sign_in` through its form."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
from api_plane import ADMIN_PASSWORD, Plane
from sqlalchemy import text

from aamp.web import site_of

ORIGIN = "http://aamp.test"
CHROMIUM = "/usr/bin/chromium"
CSRF_INPUT = re.compile(r'name="csrf" value="([^"]*)"')


class Site:
    def __init__(self, plane: Plane):
        self.plane = plane
        self.app = site_of(plane.app)  # type: ignore[arg-type]

    def browser(self, origin: str | None = ORIGIN) -> httpx.AsyncClient:
        headers = {"origin": origin} if origin else {}
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),  # type: ignore[arg-type]
            base_url=ORIGIN,
            headers=headers,
            follow_redirects=False,
        )

    async def signed_in(self, username: str = "admin", password: str = ADMIN_PASSWORD):
        b = self.browser()
        r = await b.post("/login", data={"username": username, "password": password, "next": "/"})
        assert r.status_code == 303, r.text
        return b

    def audit(self, **where: str) -> list[dict[str, Any]]:
        clause = " AND ".join(f"{k} = :{k}" for k in where) or "1=1"
        with self.plane.cp.store.engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT * FROM audit_records WHERE {clause} ORDER BY seq"), where
            ).mappings()
            return [dict(r) for r in rows]


def csrf_of(html: str) -> str:
    found = CSRF_INPUT.search(html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """`app` served by uvicorn on a loopback port for as long as the block runs; its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


async def sign_in(browser: Any, base: str, username: str, password: str) -> tuple[Any, Any]:
    """A new browser context signed in through the login form, and its page."""
    context = await browser.new_context(base_url=base, accept_downloads=True)
    page = await context.new_page()
    await page.goto("/login")
    await page.fill("#f-username", username)
    await page.fill("#f-password", password)
    await page.click("button[type=submit]")
    await page.wait_for_load_state()
    return context, page


@contextlib.asynccontextmanager
async def in_chromium(app: Any) -> AsyncIterator[tuple[str, Any]]:
    """`app` served on loopback and Debian's chromium driven by Playwright: (base URL, browser)."""
    from playwright.async_api import async_playwright

    async with served(app) as base, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM)
        try:
            yield base, browser
        finally:
            await browser.close()
