"""The UI app (Starlette): its pages, its static files, and how failures are shown.

It decides nothing itself. Every page asks the API (`backend.py`) — as the person signed in,
with their own session — for what it shows and does, so the API's guard decides and records
each step; the UI only turns answers into pages. Static files (the vendored htmx, the style
sheet, one script) are the only things it serves without asking.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from aamp.api import DEFAULT_MAX_BODY_BYTES, MAX_EXEC_BODY_BYTES, BodyLimitMiddleware
from aamp.web import admin_pages, builder_pages, identity_pages, kb_pages, run_pages
from aamp.web.backend import Backend
from aamp.web.page import LoginNeeded, PageError, error_page, render, to_login

STATIC = Path(__file__).with_name("static")


def body_limit(path: str) -> int:
    """A page's request-size limit, checked before any form is parsed (so nobody, signed in
    or not, can fill the disk with an upload): a run's input files may be as large as the
    API's run request carries (base64 makes 3 bytes 4), a knowledge base's documents as one
    document may be, any other form as the API's limit."""
    if path.startswith("/agents/") and path.endswith("/run"):
        return MAX_EXEC_BODY_BYTES * 3 // 4
    if path.startswith("/knowledge-bases/") and path.endswith("/documents"):
        return kb_pages.MAX_FORM_BYTES
    return DEFAULT_MAX_BODY_BYTES


def create_web(api: ASGIApp) -> Starlette:
    routes = [
        *identity_pages.routes(),
        *run_pages.routes(),
        *builder_pages.routes(),
        *admin_pages.routes(),
        *kb_pages.routes(),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]

    async def login_needed(request: Request, _: Exception) -> Response:
        return to_login(request)

    async def page_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PageError)
        return error_page(request, exc)

    async def not_found(request: Request, _: Exception) -> Response:
        return render(
            request,
            "error.html",
            404,
            me={},
            http_status=404,
            code="not_found",
            title="No such page",
            message=f"There is no page at {request.url.path}.",
            next_step="Check the address, or start again from the home page.",
        )

    app = Starlette(
        routes=routes,
        exception_handlers={LoginNeeded: login_needed, PageError: page_error, 404: not_found},
    )
    app.state.backend = Backend(api)
    app.add_middleware(BodyLimitMiddleware, limit_for=body_limit)
    return app
