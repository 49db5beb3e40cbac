"""The control plane's own API as an SDK connection, without a socket: `/mcp`'s tool calls.

`AsgiConnection` has the interface of `aamp.client.transport.Connection` (`send`, `stream`,
`close`, `abort`; responses with `status`, `headers`, `read`, `json`, `iter_bytes`,
`iter_lines`), so the SDK's own code (`Client`, and `AsyncClient` over it) runs unchanged. A
request is an ASGI call of the site app of this very process, a task on its event loop; so it
goes through everything a request from the network does after the socket — the request id
and body limit, the one guard (the bearer token's check, `allowed`, the decision's audit
record), the route — and is refused the same way. What it saves is the loopback hop (a
socket each way, HTTP framing and parsing on both sides, the server's per-connection
machinery) and every thread hop: the SDK's blocking-style code runs on the loop's own thread
(`on_loop`; `offload` is how `AsyncClient` runs it), waiting for the app's answer through
`on_loop.wait`, so a call is never handed between threads.

Like a socket, it pushes back: the app's body waits while `WINDOW` chunks are unread, and a
reader that leaves early (or times out) is a client gone — the app is told `http.disconnect`,
as uvicorn does, so a streamed exec's command is killed. The request has no peer address
(`client` is None: routes record "unknown").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

from aamp.client.http1 import Head, Headers
from aamp.client.transport import ClientError, Response, outgoing, raise_refusal
from aamp.mcp import on_loop

WINDOW = 8  # body chunks the app may send ahead of the reader
ASGI = {"version": "3.0", "spec_version": "2.3"}  # as uvicorn serves the API


class _Exchange:
    """One request's ASGI call, a task on the loop, and what it sent, for its reader (code
    run by `on_loop.run` on the same loop)."""

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body
        self._out: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._room = asyncio.Semaphore(WINDOW)
        self._gone = asyncio.Event()
        self._task: asyncio.Task[None] | None = None  # kept: the loop holds tasks weakly

    def start(self, app: Any, scope: dict[str, Any]) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(app, scope))

    async def _run(self, app: Any, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self._receive, self._send)
        except BaseException as exc:  # the reader must hear of it, whatever it was
            self._out.put_nowait(("failed", exc))
            if not isinstance(exc, Exception):
                raise
        else:
            self._out.put_nowait(("end", None))

    async def _receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if self._gone.is_set():
            raise OSError("the reader is gone")
        if message["type"] == "http.response.start":
            answered = message.get("headers", [])
            fields = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in answered]
            self._out.put_nowait(("start", (message["status"], Headers(fields))))
        elif message["type"] == "http.response.body":
            await self._room.acquire()
            self._out.put_nowait(("body", bytes(message.get("body", b""))))
            if not message.get("more_body", False):
                self._out.put_nowait(("end", None))

    def take(self, wait: float | None) -> tuple[str, Any]:
        """The next thing the app sent, waiting for it on the loop at most `wait` seconds."""
        if self._out.empty():
            try:
                kind, value = on_loop.wait(self._next(wait))
            except TimeoutError:
                self.leave()
                raise ClientError(
                    "timed_out", f"the control plane did not answer within {wait:g} s"
                ) from None
        else:
            kind, value = self._out.get_nowait()
        if kind == "body":
            self._room.release()
        return kind, value

    async def _next(self, wait: float | None) -> tuple[str, Any]:
        async with asyncio.timeout(wait):
            return await self._out.get()

    def leave(self) -> None:
        """The reader is gone: the app hears `http.disconnect`."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is listening
            self._gone.set()
            self._room.release()  # a chunk waiting for room goes on, and finds the reader gone


class _ExchangeBody:
    """The app's body chunks as `transport.Response` reads a socket's: `read1` gives what has
    arrived (b"" at the end), so the SDK's own response type serves both connections."""

    framed = True  # the app says where its body ends

    def __init__(self, exchange: _Exchange, wait: float | None) -> None:
        self.exchange, self._wait = exchange, wait
        self.done = False
        self._pending = b""

    def read1(self, size: int) -> bytes:
        while not self._pending and not self.done:
            kind, value = self.exchange.take(self._wait)
            if kind == "body":
                self._pending = value
            elif kind == "end":
                self.done = True
            else:  # failed: the app raised mid-body, as a connection broken off would be
                self.done = True
                raise ClientError("transfer_failed", f"transfer failed: {value}")
        chunk, self._pending = self._pending[:size], self._pending[size:]
        return chunk


class AsgiConnection:
    """Requests to the site app `app` running on this thread's event loop, from code that
    `offload` runs there: a drop-in for `transport.Connection`. A body given as an iterable
    of chunks is joined before it is sent (the tools send at most 4 MiB)."""

    offload = staticmethod(on_loop.run)  # how AsyncClient runs the SDK's code over it

    def __init__(
        self,
        app: Any,
        base_url: str,
        headers: dict[str, str],
        *,
        timeout: float | None,
    ) -> None:
        self.base = base_url
        self.timeout = timeout
        self._app = app
        self._headers = headers
        parts = urlsplit(base_url)
        self._host = parts.netloc or "localhost"
        self._server = (parts.hostname or "localhost", parts.port or 80)
        self._current: _Exchange | None = None  # one request at a time, as on a socket
        self._aborted = False

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.leave()

    def abort(self) -> None:
        """Leave every request under way (a read blocked in another thread ends), and refuse
        every later one."""
        self._aborted = True
        self.close()

    def pause(self, seconds: float) -> None:
        """Wait between polls without stopping the loop (a socket's client sleeps)."""
        on_loop.wait(asyncio.sleep(seconds))

    def send(self, method: str, path: str, **kw: Any) -> Response:
        """One request whose body is read before it returns; a refusal is a ClientError."""
        resp = self._request(method, path, **kw)
        resp.read()
        return resp

    @contextlib.contextmanager
    def stream(self, method: str, path: str, **kw: Any) -> Iterator[Response]:
        """A request whose body the caller reads as it arrives; its status is checked first.
        Leaving early tells the app the reader is gone."""
        resp = self._request(method, path, **kw)
        exchange = self._current
        try:
            yield resp
        finally:
            if not resp.complete and exchange is not None:
                exchange.leave()

    def _request(self, method: str, path: str, **kw: Any) -> Response:
        if self._aborted:
            raise ClientError("aborted", "this connection was cut (abort); make a new client")
        req = outgoing(method, path, self._headers, self.timeout, **kw)
        content = req.body
        body = content if isinstance(content, (bytes, bytearray)) else b"".join(content or ())
        sent = {**req.headers, "content-length": str(len(body))}
        scope = {
            "type": "http",
            "asgi": ASGI,
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": unquote(req.path),
            "raw_path": req.path.encode(),
            "root_path": "",
            "query_string": req.query.encode(),
            "headers": [
                (b"host", self._host.encode()),
                *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in sent.items()),
            ],
            "client": None,
            "server": self._server,
            "state": {},
        }
        wait = req.wait
        exchange = _Exchange(bytes(body))
        exchange.start(self._app, scope)
        self._current = exchange
        kind, value = exchange.take(wait)
        if kind != "start":
            raise ClientError("transfer_failed", f"transfer failed: {value or 'no answer'}")
        status, answered = value
        resp = Response(Head("HTTP/1.1", status, "", answered), _ExchangeBody(exchange, wait))
        if not 200 <= status < 300:
            raise_refusal(resp)
        return resp
