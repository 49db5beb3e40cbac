"""The control plane's own API as an SDK connection, without a socket: `/mcp`'s tool calls.

`AsgiConnection` has the interface of `aamp.client.transport.Connection` (`send`, `stream`,
`close`, `abort`; responses with `status`, `headers`, `read`, `json`, `iter_bytes`,
`iter_lines`), so the SDK's own code (`Client`, and `AsyncClient` in its worker threads) runs
unchanged over it. A request is an ASGI call of the site app of this very process, scheduled
on its event loop from the calling thread; so it goes through everything a request from the
network does after the socket — the request id and body limit, the one guard (the bearer
token's check, `allowed`, the decision's audit record), the route — and is refused the same
way. What it saves is only the loopback hop: a socket each way, HTTP framing and parsing on
both sides, and the server's per-connection machinery.

Like a socket, it pushes back: the app's body waits while `WINDOW` chunks are unread, and a
reader that leaves early (or times out) is a client gone — the app is told `http.disconnect`,
as uvicorn does, so a streamed exec's command is killed. The request has no peer address
(`client` is None: routes record "unknown").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from aamp.client.transport import USE_CLIENT_DEFAULT, ClientError, Timeout, UseClientDefault

# RFC 3986 pchar and "/", plus "%", as the socket transport sends a path.
PATH_SAFE = "/%:@!$&'()*+,;="
WINDOW = 8  # body chunks the app may send ahead of the reader
ASGI = {"version": "3.0", "spec_version": "2.3"}  # as uvicorn serves the API


class _Exchange:
    """One request's ASGI call on the loop, and what it sent, handed to the reading thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, body: bytes) -> None:
        self.loop = loop
        self._body: bytes | None = body
        self._out: queue.Queue[tuple[str, Any]] = queue.Queue()
        # Made here, in the calling thread: asyncio's primitives bind to a loop on first use,
        # which is on `loop` (the app's side, or `call_soon_threadsafe` from the reader's).
        self._room = asyncio.Semaphore(WINDOW)
        self._gone = asyncio.Event()

    async def run(self, app: Any, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self._receive, self._send)
        except BaseException as exc:  # the reader must hear of it, whatever it was
            self._out.put(("failed", exc))
            if not isinstance(exc, Exception):
                raise
        else:
            self._out.put(("end", None))

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
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in answered}
            self._out.put(("start", (message["status"], headers)))
        elif message["type"] == "http.response.body":
            await self._room.acquire()
            self._out.put(("body", bytes(message.get("body", b""))))
            if not message.get("more_body", False):
                self._out.put(("end", None))

    def take(self, wait: float | None) -> tuple[str, Any]:
        """The next thing the app sent (from the reading thread)."""
        try:
            kind, value = self._out.get(timeout=wait)
        except queue.Empty:
            self.leave()
            raise ClientError(
                "timed_out", f"the control plane did not answer within {wait:g} s"
            ) from None
        if kind == "body":
            self.loop.call_soon_threadsafe(self._room.release)
        return kind, value

    def leave(self) -> None:
        """The reader is gone (from any thread): the app hears `http.disconnect`."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is listening
            self.loop.call_soon_threadsafe(self._left)

    def _left(self) -> None:
        self._gone.set()
        self._room.release()  # a body chunk waiting for room goes on, and finds the reader gone


class AsgiResponse:
    """A response whose body arrives from the app as the caller reads it."""

    def __init__(self, exchange: _Exchange, status: int, headers: dict[str, str], wait: Any):
        self._exchange, self._wait = exchange, wait
        self.status, self.headers = status, headers
        self._body: bytes | None = None
        self._ended = False
        self._pending = b""

    @property
    def complete(self) -> bool:
        return self._ended

    def _chunks(self) -> Iterator[bytes]:
        if self._pending:
            pending, self._pending = self._pending, b""
            yield pending
        while not self._ended:
            kind, value = self._exchange.take(self._wait)
            if kind == "body":
                if value:
                    yield value
            elif kind == "end":
                self._ended = True
            else:  # failed: the app raised mid-body, as a connection broken off would be
                self._ended = True
                raise ClientError("transfer_failed", f"transfer failed: {value}")

    def read(self) -> bytes:
        """The rest of the body (kept: a second call returns the same bytes)."""
        if self._body is None:
            self._body = b"".join(self._chunks())
        return self._body

    def json(self) -> Any:
        body = self.read()
        return json.loads(body) if body else None

    def iter_bytes(self, size: int = 64 * 1024) -> Iterator[bytes]:
        for chunk in self._chunks():
            for at in range(0, len(chunk), size):
                yield chunk[at : at + size]

    def iter_lines(self) -> Iterator[str]:
        """The body's lines as text, without their line ends ("\\n" or "\\r\\n")."""
        rest = b""
        for chunk in self._chunks():
            rest += chunk
            *lines, rest = rest.split(b"\n")
            for line in lines:
                yield line.decode("utf-8").removesuffix("\r")
        if rest:
            yield rest.decode("utf-8").removesuffix("\r")


class AsgiConnection:
    """Requests to the site app `app` running on `loop`, from a thread other than the loop's
    (an `AsyncClient`'s worker threads): a drop-in for `transport.Connection`. A body given
    as an iterable of chunks is joined before it is sent (the tools send at most 4 MiB)."""

    def __init__(
        self,
        app: Any,
        loop: asyncio.AbstractEventLoop,
        base_url: str,
        headers: dict[str, str],
        *,
        timeout: float | None,
    ) -> None:
        self.base = base_url
        self.timeout = timeout
        self._app, self._loop = app, loop
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

    def send(self, method: str, path: str, **kw: Any) -> AsgiResponse:
        """One request whose body is read before it returns; a refusal is a ClientError."""
        resp = self._request(method, path, **kw)
        resp.read()
        return resp

    @contextlib.contextmanager
    def stream(self, method: str, path: str, **kw: Any) -> Iterator[AsgiResponse]:
        """A request whose body the caller reads as it arrives; its status is checked first.
        Leaving early tells the app the reader is gone."""
        resp = self._request(method, path, **kw)
        try:
            yield resp
        finally:
            if not resp.complete:
                resp._exchange.leave()

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: Any = None,
        content: bytes | Iterable[bytes] | None = None,
        headers: dict[str, str] | None = None,
        timeout: Timeout = USE_CLIENT_DEFAULT,
    ) -> AsgiResponse:
        if self._aborted:
            raise ClientError("aborted", "this connection was cut (abort); make a new client")
        sent = {**self._headers, **(headers or {})}
        if json is not None:
            content = _json_bytes(json)
            sent["content-type"] = "application/json"
        body = content if isinstance(content, (bytes, bytearray)) else b"".join(content or ())
        sent["content-length"] = str(len(body))
        target = quote(path, safe=PATH_SAFE)
        scope = {
            "type": "http",
            "asgi": ASGI,
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": unquote(target),
            "raw_path": target.encode(),
            "root_path": "",
            "query_string": urlencode(params or {}).encode(),
            "headers": [
                (b"host", self._host.encode()),
                *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in sent.items()),
            ],
            "client": None,
            "server": self._server,
            "state": {},
        }
        wait = self.timeout if isinstance(timeout, UseClientDefault) else timeout
        exchange = _Exchange(self._loop, bytes(body))
        asyncio.run_coroutine_threadsafe(exchange.run(self._app, scope), self._loop)
        self._current = exchange
        kind, value = exchange.take(wait)
        if kind != "start":
            raise ClientError("transfer_failed", f"transfer failed: {value or 'no answer'}")
        status, answered = value
        resp = AsgiResponse(exchange, status, answered, wait)
        if not 200 <= status < 300:
            _raise_refusal(resp)
        return resp


def _raise_refusal(resp: AsgiResponse) -> None:
    try:
        data = json.loads(resp.read())
        raise ClientError(data["code"], data["message"], resp.status)
    except (ValueError, KeyError, TypeError):
        raise ClientError("http_error", f"HTTP {resp.status}", resp.status) from None


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
