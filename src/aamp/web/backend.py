"""The UI's one way to the control plane: a request to the API app, in the same process.

Every page and every form of the UI is a client of `/v1`: the page's request becomes an API
request carrying the browser's own credentials (the session cookie, the CSRF token the form
carried, the Origin, the client address), handed to the API's ASGI app directly — no socket,
no second authorisation path. So each UI action passes the same guard, the same `allowed`,
the same route code, and leaves the same audit records as its API twin.

An answer's body is read whole (`call`) or streamed as it comes (`stream`: server-sent events,
downloads), so a run's steps reach the browser while the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message

from aamp.api import CSRF_HEADER, SESSION_COOKIE

# What of the browser's request the API sees: its credentials and where it comes from.
PASSED_HEADERS = ("cookie", "origin", "sec-fetch-site", "user-agent", "x-request-id")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    cookies: list[str] = field(default_factory=list)  # Set-Cookie values, passed on as they are

    @property
    def ok(self) -> bool:
        return self.status < 400

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def message(self) -> str:
        """The API's `message` for an error (its JSON `{code, message}`)."""
        try:
            data = self.json()
        except ValueError:
            return self.body.decode("utf-8", "replace")[:500]
        return str(data.get("message", "")) if isinstance(data, dict) else ""

    @property
    def code(self) -> str:
        try:
            data = self.json()
        except ValueError:
            return ""
        return str(data.get("code", "")) if isinstance(data, dict) else ""


@dataclass
class Streamed:
    """An answer whose body arrives piece by piece; `close()` ends the API's side of it."""

    answer: Answer
    chunks: AsyncIterator[bytes]
    close: Any


class Backend:
    """Calls into the API app on behalf of one browser request."""

    def __init__(self, api: ASGIApp) -> None:
        self.api = api

    def _scope(
        self, request: Request, method: str, path: str, query: str, extra: dict[str, str]
    ) -> dict[str, Any]:
        headers: list[tuple[bytes, bytes]] = []
        for name in PASSED_HEADERS:
            value = request.headers.get(name)
            if value is not None:
                headers.append((name.encode(), value.encode("latin-1")))
        headers.append((b"host", request.headers.get("host", "localhost").encode("latin-1")))
        for name, value in extra.items():
            headers.append((name.lower().encode(), value.encode("latin-1")))
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": request.url.scheme,
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": query.encode(),
            "headers": headers,
            "client": request.scope.get("client"),
            "server": request.scope.get("server"),
            "state": {},
        }

    async def stream(
        self,
        request: Request,
        method: str,
        path: str,
        *,
        query: str = "",
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> Streamed:
        scope = self._scope(request, method, path, query, headers or {})
        out: asyncio.Queue[Message | None] = asyncio.Queue()
        gone = asyncio.Event()
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            await out.put(message)

        async def run() -> None:
            try:
                await self.api(scope, receive, send)
            finally:
                await out.put(None)

        task = asyncio.create_task(run())

        async def close() -> None:
            gone.set()
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

        start = await out.get()
        if start is None or start["type"] != "http.response.start":
            await close()
            return Streamed(
                Answer(500, {}, b'{"message":"the API gave no answer"}'), _none(), close
            )
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", [])]
        answer = Answer(
            start["status"],
            {k.lower(): v for k, v in raw if k.lower() != "set-cookie"},
            cookies=[v for k, v in raw if k.lower() == "set-cookie"],
        )

        async def chunks() -> AsyncIterator[bytes]:
            while True:
                message = await out.get()
                if message is None:
                    return
                if message["type"] == "http.response.body":
                    if message.get("body"):
                        yield message["body"]
                    if not message.get("more_body", False):
                        return

        return Streamed(answer, chunks(), close)

    async def call(
        self,
        request: Request,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        body: bytes | None = None,
        content_type: str | None = None,
        query: str = "",
        csrf: str | None = None,
    ) -> Answer:
        """One API request, its answer read whole. `csrf` is the token the form carried, sent
        as the API's CSRF header (the guard checks it against the session)."""
        headers: dict[str, str] = {}
        if json_body is not None:
            body = json.dumps(json_body).encode()
            content_type = "application/json"
        if content_type is not None:
            headers["content-type"] = content_type
        if body:
            headers["content-length"] = str(len(body))
        if csrf is not None:
            headers[CSRF_HEADER] = csrf
        streamed = await self.stream(
            request, method, path, query=query, body=body or b"", headers=headers
        )
        try:
            streamed.answer.body = b"".join([c async for c in streamed.chunks])
        finally:
            await streamed.close()
        return streamed.answer


async def _none() -> AsyncIterator[bytes]:
    return
    yield b""  # an empty async generator


def session_cookie(request: Request) -> str | None:
    return request.cookies.get(SESSION_COOKIE)
