"""Two ASGI middlewares every request passes: a request id, and a request-size limit.

The request id (`X-Request-Id`: the client's if it is a short safe token, else a new one) is
put in the scope's state, stored in every audit record the request causes, and returned in
the response. The size limit refuses a declared Content-Length over the limit at once, and
cuts off a chunked body the moment it passes the limit — before any route sees it.
File uploads have their own limit (AAMP_MAX_FILE_BYTES) checked by their route.
"""

from __future__ import annotations

import json
import random
import re
import secrets
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{8,64}\Z")


class RequestIdMiddleware:
    """Request ids need to be unique, not secret (a client may choose its own), so they come
    from a per-middleware PRNG seeded from the OS once: `os.urandom` releases the GIL, and on a
    busy server every release hands the event loop's GIL to a database thread for up to the
    interpreter's switch interval (5 ms) — per request, on the hot path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._ids = random.Random(secrets.randbits(128))

    def new_id(self) -> str:
        return f"req-{self._ids.getrandbits(64):016x}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = ""
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                given = value.decode("latin-1")
        rid = given if REQUEST_ID_RE.match(given) else self.new_id()
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)


class BodyLimitMiddleware:
    """`limit_for(path)` gives the byte limit for a path, or None for routes that check their
    own (file uploads)."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int | None]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limit_for(scope.get("path", "")) if scope["type"] == "http" else None
        if limit is None:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                raw = value.decode("latin-1")
                if not raw.isdigit():
                    await _reply(send, 400, "invalid_request", "Content-Length is not a number")
                    return
                if int(raw) > limit:
                    await _reply(send, 413, "too_large", f"the request body is over {limit} bytes")
                    return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, f"the request body is over {limit} bytes")
            return message

        await self.app(scope, counted, send)


async def _reply(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"code": code, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
