"""One keep-alive HTTP/1.1 connection to the control plane, its failures as `ClientError`.

Standard library only (`http.client`): a command pays for no HTTP package's import (httpx's
alone takes longer than a CLI command's whole budget of 150 ms), and the SDK this grows into
needs nothing besides. What the API answers with a non-2xx status is raised as a `ClientError` with
the API's own `code` and `message`; a control plane that cannot be reached, does not answer in
time or breaks off mid-answer is a `ClientError` too, so callers handle one kind of error.

A request's path is sent as given (no dot-segment folding, so a name such as `..` reaches the
route it was meant for), with characters outside RFC 3986's path characters percent-encoded:
`?` and `#` in a name stay part of the name, and a query is only ever given as `params`.

    conn = Connection("http://127.0.0.1:8700", {"authorization": "Bearer ..."}, timeout=120)
    conn.send("GET", "/v1/sandboxes").json()
    with conn.stream("GET", "/v1/runs/run-1/events") as resp:
        for line in resp.iter_lines(): ...
    conn.close()
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
from collections.abc import Iterable, Iterator
from urllib.parse import quote, urlencode, urlsplit

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from typing import Any

CONNECT_TIMEOUT = 5.0
# RFC 3986 pchar and "/", plus "%" so a caller's own escapes (an artifact's quoted name) stay.
PATH_SAFE = "/%:@!$&'()*+,;="


class UseClientDefault:
    """The type of `USE_CLIENT_DEFAULT`: a request's timeout left to the connection's own."""


USE_CLIENT_DEFAULT = UseClientDefault()
Timeout = float | None | UseClientDefault  # seconds; None: wait as long as it takes


class ClientError(Exception):
    """The API refused (its `code` and `message`), or could not be reached or read."""

    def __init__(self, code: str, message: str, status: int = 0):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class Response:
    """A response whose body is read as the caller asks; read errors are `ClientError`s."""

    def __init__(self, raw: http.client.HTTPResponse):
        self._raw = raw
        self._body: bytes | None = None
        self.status = raw.status
        self.headers = raw.headers

    @property
    def complete(self) -> bool:
        """Whether the whole body has been read (the connection may then carry another)."""
        return self._raw.isclosed()

    def read(self) -> bytes:
        """The rest of the body (kept: a second call returns the same bytes)."""
        if self._body is None:
            with _transfer():
                self._body = self._raw.read()
        return self._body

    def json(self) -> Any:
        body = self.read()
        return json.loads(body) if body else None

    def iter_bytes(self, size: int = 64 * 1024) -> Iterator[bytes]:
        while True:
            with _transfer():
                chunk = self._raw.read1(size)
            if not chunk:
                self._check_ended()
                return
            yield chunk

    def iter_lines(self) -> Iterator[str]:
        """The body's lines as text, without their line ends ("\\n" or "\\r\\n")."""
        while True:
            with _transfer():
                line = self._raw.readline()
            if not line:
                self._check_ended()
                return
            yield line.decode("utf-8").removesuffix("\n").removesuffix("\r")

    def _check_ended(self) -> None:
        # http.client's partial reads end quietly when the connection does; a body that
        # stops short of its content-length is a failed transfer, not a shorter file.
        missing = self._raw.length
        if missing:
            raise ClientError(
                "transfer_failed",
                f"transfer failed: the answer ended {missing} bytes short of its length",
            )


class Connection:
    """Requests to one control plane, one at a time, over one reused connection."""

    def __init__(self, base_url: str, headers: dict[str, str], *, timeout: float | None):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ClientError("bad_url", f"{base_url}: the API's address must be http://HOST:PORT")
        self.base = base_url
        self.timeout = timeout
        self._headers = headers
        self._aborted = False
        self._conn = http.client.HTTPConnection(
            parts.hostname, parts.port or 80, timeout=CONNECT_TIMEOUT
        )

    def close(self) -> None:
        self._conn.close()

    def abort(self) -> None:
        """Shut the socket down (a read blocked in another thread returns), and refuse every
        later request: for a reader that is no longer wanted."""
        self._aborted = True
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def send(self, method: str, path: str, **kw: Any) -> Response:
        """One request whose body is read before it returns; a refusal is a ClientError."""
        resp = self._request(method, path, unreachable_hint="; start it with `aamp up`", **kw)
        resp.read()
        return resp

    @contextlib.contextmanager
    def stream(self, method: str, path: str, **kw: Any) -> Iterator[Response]:
        """A request whose body the caller reads as it arrives; its status is checked first.
        Leaving early closes the connection, which tells the server the reader is gone."""
        resp = self._request(method, path, unreachable_hint="", **kw)
        try:
            yield resp
        finally:
            if not resp.complete:
                self._conn.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        unreachable_hint: str,
        params: dict[str, str] | None = None,
        json: Any = None,
        content: bytes | Iterable[bytes] | None = None,
        headers: dict[str, str] | None = None,
        timeout: Timeout = USE_CLIENT_DEFAULT,
    ) -> Response:
        if self._aborted:
            raise ClientError("aborted", "this connection was cut (abort); make a new client")
        target = quote(path, safe=PATH_SAFE)
        if params:
            target += "?" + urlencode(params)
        sent = {**self._headers, **(headers or {})}
        if json is not None:
            content = _json_bytes(json)
            sent["content-type"] = "application/json"
        self._connect(unreachable_hint)
        sock = self._conn.sock
        assert sock is not None
        wait = self.timeout if isinstance(timeout, UseClientDefault) else timeout
        sock.settimeout(wait)
        try:
            raw = self._exchange(method, target, content, sent)
        except TimeoutError:
            self._conn.close()
            raise ClientError(
                "timed_out", f"the control plane did not answer within {wait:g} s"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            raise ClientError("transfer_failed", f"transfer failed: {_reason(exc)}") from None
        resp = Response(raw)
        if not 200 <= resp.status < 300:
            _raise_refusal(resp)
        return resp

    def _exchange(
        self, method: str, target: str, body: bytes | Iterable[bytes] | None, headers: dict
    ) -> http.client.HTTPResponse:
        try:
            self._conn.request(method, target, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError) as exc:
            # The server stopped reading the body: it may have answered first (an upload
            # refused by its size is), and that answer is what the caller needs to see.
            try:
                return self._conn.getresponse()
            except (OSError, http.client.HTTPException):
                raise exc from None
        return self._conn.getresponse()

    def _connect(self, unreachable_hint: str) -> None:
        sock = self._conn.sock
        if sock is not None and select.select([sock], [], [], 0)[0]:
            # Readable while idle: the server closed its end (or sent what nobody asked for).
            self._conn.close()
        if self._conn.sock is None:
            try:
                self._conn.connect()
            except OSError:
                self._conn.close()
                raise ClientError(
                    "unreachable",
                    f"the control plane is not reachable at {self.base}{unreachable_hint}",
                ) from None


def _raise_refusal(resp: Response) -> None:
    body = resp.read()
    try:
        data = json.loads(body)
        raise ClientError(data["code"], data["message"], resp.status)
    except (ValueError, KeyError, TypeError):
        raise ClientError("http_error", f"HTTP {resp.status}", resp.status) from None


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


@contextlib.contextmanager
def _transfer() -> Iterator[None]:
    """Reading a body: a broken or timed-out connection is a ClientError naming why."""
    try:
        yield
    except (OSError, http.client.HTTPException) as exc:
        raise ClientError("transfer_failed", f"transfer failed: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "the control plane stopped sending (timed out)"
    return str(exc) or type(exc).__name__
