"""One browser request as the UI handles it: who is asking (from `/v1/me`), the API calls the
page makes on their behalf, its form with the CSRF token, and the page it renders.

A failed API call becomes what the person sees: no session -> the sign-in page (coming back
afterwards); any other error -> an error page saying what happened (the API's own message,
which names the rule for a refusal) and what to do. A form's failed call is shown on the form
itself instead, at the field the message names, with what was typed kept.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from aamp.web.backend import Answer, Backend, session_cookie

CSRF_COOKIE = "aamp_csrf"
CSRF_FIELD = "csrf"
TEMPLATES = Path(__file__).with_name("templates")
# `field.path: message` (or `field[3].name: message`) at the start of a line of an API error.
FIELD_RE = re.compile(r"^\s*([A-Za-z_][\w.\[\]-]*): (.+)$")

ENV = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)

# What to do next, by HTTP status, on an error page.
NEXT_STEP = {
    400: "Correct the input and try again.",
    403: "Ask an admin for the role or grant this needs; the refusal is in the audit log.",
    404: "Check the address, or go back to the list it came from.",
    409: "Reload the page to see the current state, then try again.",
    413: "Send less data, within the limit named above.",
    422: "Correct the input and try again.",
    429: "Wait a few minutes before trying again.",
}


class LoginNeeded(Exception):
    """No valid session: the person is sent to sign in."""


class PageError(Exception):
    """An API call failed; shown as an error page."""

    def __init__(self, answer: Answer, title: str = "", me: dict[str, Any] | None = None):
        super().__init__(answer.message)
        self.answer, self.title, self.me = answer, title, me or {}


def field_errors(message: str) -> dict[str, str]:
    """The API's error message split by the field each line names (`""`: not one field)."""
    out: dict[str, str] = {}
    for line in message.splitlines() or [message]:
        for part in line.split("; "):
            found = FIELD_RE.match(part)
            key = re.sub(r"\[\d+\]", "", found.group(1)) if found else ""
            text = part.strip()
            if text and not text.endswith(":"):
                out[key] = f"{out[key]}; {text}" if key in out else text
    return out


async def create_named(request: Request, api_path: str) -> tuple[Page, str, Answer, dict]:
    """A form whose one field, `name`, makes something: POST `{"name": ...}` to `api_path`.
    The page, the name typed, the API's answer, and (when it failed) its message at the name
    field; a refusal is the 403 page."""
    page = await Page.signed_in(request)
    await page.form()
    name = page.text("name").strip()
    answer = await page.call("POST", api_path, json_body={"name": name})
    if answer.status == 403:
        raise PageError(answer, me=page.me)
    errors = {}
    if not answer.ok:
        errors = {"name": field_errors(answer.message).get("name") or answer.message}
    return page, name, answer, errors


async def list_with_form(
    request: Request,
    listed: str,
    template: str,
    status: int,
    context: dict[str, Any],
    **more: Any,
) -> Response:
    """A page listing what `/v1/{listed}` answers (its template gets it under that name, dashes
    as underscores), with a form (its values, errors) below; `more` goes to the template."""
    page = context.pop("page", None) or await Page.signed_in(request)
    return page.render(
        template,
        status,
        **{listed.replace("-", "_"): await page.get(f"/v1/{listed}")},
        values=context.get("values", {}),
        errors=context.get("errors", {}),
        **more,
    )


def local_path(target: str | None, default: str = "/") -> str:
    """`target` if it is a path on this site (never another host: `//x`, `/\\x`)."""
    if target and target.startswith("/") and not target.startswith(("//", "/\\")):
        return target
    return default


class Page:
    """Usage::

    page = await Page.signed_in(request)        # LoginNeeded without a session
    agents = await page.get("/v1/agents")       # PageError on an error answer
    return page.render("agents.html", agents=agents)
    """

    def __init__(self, request: Request, me: dict[str, Any] | None = None):
        self.request = request
        self.backend: Backend = request.app.state.backend
        self.me = me or {}
        self.form_data: FormData | None = None

    @classmethod
    async def signed_in(cls, request: Request) -> Page:
        page = cls(request)
        page._take_me(await page.backend.call(request, "GET", "/v1/me"))
        return page

    @classmethod
    async def signed_in_reading(
        cls, request: Request, *reads: tuple[str, dict[str, Any]]
    ) -> tuple[Page, list[Answer]]:
        """`signed_in`, with the page's reads (`(path, query)`, GETs) asked at the same time
        as its `/v1/me`, so their audit records share one group commit rather than each
        waiting for the one before. The API still decides each read; an answer that is an
        error is the caller's to show. Without a session only `/v1/me` is asked (the person is
        sent to sign in), so nobody's refusal is recorded three times."""
        if session_cookie(request) is None:
            page = await cls.signed_in(request)
            return page, [await page.call("GET", path, query=q) for path, q in reads]
        page = cls(request)
        me, *answers = await asyncio.gather(
            page.backend.call(request, "GET", "/v1/me"),
            *(page.backend.call(request, "GET", path, query=_query(q)) for path, q in reads),
        )
        page._take_me(me)
        if any(a.status == 401 for a in answers):
            raise LoginNeeded()
        return page, answers

    def _take_me(self, answer: Answer) -> None:
        if answer.status == 401:
            raise LoginNeeded()
        if not answer.ok:
            raise PageError(answer)
        self.me = answer.json()

    @property
    def role(self) -> str:
        return str(self.me.get("role", ""))

    def level(self, agent_id: str) -> str:
        for item in self.me.get("agents", []):
            if item["agent_id"] == agent_id:
                return str(item["level"])
        return ""

    async def get(self, path: str, **query: Any) -> Any:
        answer = await self.call("GET", path, query=query)
        if not answer.ok:
            raise PageError(answer, me=self.me)
        return answer.json()

    async def call(
        self, method: str, path: str, *, query: dict[str, Any] | None = None, **kw: Any
    ) -> Answer:
        """An API call as this person; unsafe ones carry the CSRF token their form sent."""
        q = _query(query or {})
        csrf = None
        if method != "GET":
            csrf = str(self.form_data.get(CSRF_FIELD, "")) if self.form_data is not None else ""
        answer = await self.backend.call(self.request, method, path, query=q, csrf=csrf, **kw)
        if answer.status == 401:
            raise LoginNeeded()
        return answer

    async def form(self) -> FormData:
        if self.form_data is None:
            self.form_data = await self.request.form(max_files=100, max_fields=200)
        return self.form_data

    def text(self, name: str, default: str = "") -> str:
        assert self.form_data is not None, "read the form first"
        value = self.form_data.get(name, default)
        return value if isinstance(value, str) else default

    def render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        return render(self.request, template, status, me=self.me, **context)


def _query(query: dict[str, Any]) -> str:
    return urlencode({k: v for k, v in query.items() if v not in (None, "")})


def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = ENV.get_template(template).render(
        csrf=request.cookies.get(CSRF_COOKIE, ""),
        csrf_field=CSRF_FIELD,
        path=request.url.path,
        query=request.query_params,
        **context,
    )
    return HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})


def error_page(request: Request, exc: PageError) -> Response:
    status = exc.answer.status
    return render(
        request,
        "error.html",
        status,
        me=exc.me,
        http_status=status,
        code=exc.answer.code,
        message=exc.answer.message or "the request failed",
        title=exc.title or ("Not allowed" if status == 403 else "Something went wrong"),
        next_step=NEXT_STEP.get(status, "Try again later; if it keeps failing, tell an admin."),
    )


def to_login(request: Request) -> RedirectResponse:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(here)}", status_code=303)


def back(to: str) -> RedirectResponse:
    """After a successful form: see the result (POST, then redirect, then GET)."""
    return RedirectResponse(to, status_code=303)
