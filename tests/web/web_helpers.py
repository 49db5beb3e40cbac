"""`Site`: the API and the UI of an in-process control plane, and browser-like clients of it
(`browser()`: cookies kept, the site's own Origin on every form post, as a browser sends)."""

from __future__ import annotations

import re
from typing import Any

import httpx
from api_plane import ADMIN_PASSWORD, Plane
from sqlalchemy import text

from aamp.web import site_of

ORIGIN = "http://aamp.test"
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
