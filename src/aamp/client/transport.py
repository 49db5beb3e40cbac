"""One keep-alive HTTP/1.1 connection to the control plane, its failures as `ClientError`.

Standard library only, with the wire format in `aamp.client.http1` rather than `http.client`:
a command pays for no HTTP package's import (httpx's alone takes longer than a CLI command's
whole budget of 150 ms; http.client's e-mail header parser and `ssl`, ~30 ms), and the SDK
needs nothing besides. The connection is kept for the next request while the control plane
keeps it open (HTTP/1.1 keep-alive), and opened again when it was closed between requests.

What the API answers with a non-2xx status is raised as a `ClientError` with the API's own
`code` and `message`; a control plane that cannot be reached, does not answer in time or
breaks off mid-answer (or sends what is not HTTP/1.1) is a `ClientError` too, so callers
handle one kind of error.

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
import json
import select
import socket
from collections.abc import Iterable, Iterator
from urllib.parse import quote, urlencode, urlsplit

from aamp.client.http1 import (
    Body,
    Head,
    ProtocolError,
    body_chunks,
    check_request,
    read_head,
    request_head,
)

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from io import BufferedReader
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
    """An answer whose body is read as the caller asks; read errors are `ClientError`s."""

    def __init__(self, head: Head, body: Body):
        self._body_reader = body
        self._body: bytes | None = None
        self.status = head.status
        self.headers = head.headers
        # Whether the connection may carry another request once the body is read.
        self.reusable = head.keeps_alive and body.framed

    @property
    def complete(self) -> bool:
        """Whether the whole body has been read (the connection may then carry another)."""
        return self._body_reader.done

    def read(self) -> bytes:
        """The rest of the body (kept: a second call returns the same bytes)."""
        if self._body is None:
            self._body = b"".join(self.iter_bytes())
        return self._body

    def json(self) -> Any:
        body = self.read()
        return json.loads(body) if body else None

    def iter_bytes(self, size: int = 64 * 1024) -> Iterator[bytes]:
        """The body's bytes as they arrive."""
        while True:
            with _transfer():
                chunk = self._body_reader.read1(size)
            if not chunk:
                return
            yield chunk

    def iter_lines(self) -> Iterator[str]:
        """The body's lines as text, without their line ends ("\\n" or "\\r\\n"), each as
        soon as it has arrived whole."""
        pending: list[bytes] = []  # the start of a line not yet ended
        for chunk in self.iter_bytes():
            if b"\n" not in chunk:
                pending.append(chunk)
                continue
            *lines, rest = b"".join([*pending, chunk]).split(b"\n")
            pending = [rest]
            for line in lines:
                yield line.decode("utf-8").removesuffix("\r")
        if last := b"".join(pending):
            yield last.decode("utf-8").removesuffix("\r")


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
        # An ASCII name is given to getaddrinfo as bytes: as text it goes through the IDNA
        # codec, whose import alone is ~2 ms of every command.
        hostname = parts.hostname
        self._address = (hostname.encode() if hostname.isascii() else hostname, parts.port or 80)
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        self._host = host if parts.port is None else f"{host}:{parts.port}"
        self._sock: socket.socket | None = None
        self._file: BufferedReader | None = None
        self._last: Response | None = None  # the answer the connection carried last

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = self._last = None

    def abort(self) -> None:
        """Shut the socket down (a read blocked in another thread returns), and refuse every
        later request: for a reader that is no longer wanted."""
        self._aborted = True
        sock = self._sock
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
                self.close()

    def _request(self, method: str, path: str, *, unreachable_hint: str, **kw: Any) -> Response:
        if self._aborted:
            raise ClientError("aborted", "this connection was cut (abort); make a new client")
        req = outgoing(method, path, self._headers, self.timeout, **kw)
        try:
            head, chunked = request_head(method, req.target, self._host, req.headers, req.body)
        except ValueError as exc:
            raise ClientError("bad_request", str(exc)) from None
        sock, file = self._connect(unreachable_hint)
        sock.settimeout(wait := req.wait)
        try:
            resp = self._exchange(sock, file, method, head, req.body, chunked=chunked)
        except TimeoutError:
            self.close()
            raise ClientError(
                "timed_out", f"the control plane did not answer within {wait:g} s"
            ) from None
        except (OSError, ProtocolError) as exc:
            self.close()
            raise ClientError("transfer_failed", f"transfer failed: {_reason(exc)}") from None
        self._last = resp
        if not 200 <= resp.status < 300:
            raise_refusal(resp)
        return resp

    def _exchange(
        self,
        sock: socket.socket,
        file: BufferedReader,
        method: str,
        head: bytes,
        body: bytes | Iterable[bytes] | None,
        *,
        chunked: bool,
    ) -> Response:
        try:
            if body is None or isinstance(body, bytes | bytearray | memoryview):
                sock.sendall(head + bytes(body or b""))
            else:
                sock.sendall(head)
                for piece in body_chunks(body, chunked=chunked):
                    sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError) as exc:
            # The server stopped reading the body: it may have answered first (an upload
            # refused by its size is), and that answer is what the caller needs to see.
            try:
                return self._answer(file, method)
            except (OSError, ProtocolError):
                raise exc from None
        return self._answer(file, method)

    @staticmethod
    def _answer(file: BufferedReader, method: str) -> Response:
        head = read_head(file)
        return Response(head, Body(file, head, method=method))

    def _connect(self, unreachable_hint: str) -> tuple[socket.socket, BufferedReader]:
        last, sock = self._last, self._sock
        if sock is not None and (
            (last is not None and not (last.complete and last.reusable))
            # Readable while idle: the server closed its end (or sent what nobody asked for).
            or select.select([sock], [], [], 0)[0]
        ):
            self.close()
        if self._sock is None or self._file is None:
            try:
                self._sock = socket.create_connection(self._address, timeout=CONNECT_TIMEOUT)
            except OSError:
                self.close()
                raise ClientError(
                    "unreachable",
                    f"the control plane is not reachable at {self.base}{unreachable_hint}",
                ) from None
            self._file = self._sock.makefile("rb")
        return self._sock, self._file


class Outgoing:
    """A request as both connections send it (`outgoing`). A plain class: `typing`'s
    NamedTuple would cost every command its import (see aamp.client)."""

    __slots__ = ("body", "headers", "path", "query", "wait")

    def __init__(
        self,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes | Iterable[bytes] | None,
        wait: float | None,
    ) -> None:
        self.path = path  # percent-encoded, PATH_SAFE kept as it is
        self.query = query  # "" for none
        self.headers = headers  # the connection's, then the caller's over them
        self.body = body
        self.wait = wait  # seconds for the answer; None: as long as it takes

    @property
    def target(self) -> str:
        """The request line's target: the path and, if there is one, the query."""
        return f"{self.path}?{self.query}" if self.query else self.path


def outgoing(
    method: str,
    path: str,
    base_headers: dict[str, str],
    base_timeout: float | None,
    *,
    params: dict[str, str] | None = None,
    json: Any = None,
    content: bytes | Iterable[bytes] | None = None,
    headers: dict[str, str] | None = None,
    timeout: Timeout = USE_CLIENT_DEFAULT,
) -> Outgoing:
    """What a connection sends for one call of `send` or `stream` (their keywords are these):
    the caller's headers over the connection's, a JSON body encoded with its content type, the
    timeout the call asks for or the connection's. A method or header that cannot be sent
    (`http1.check_request`) is a ClientError `bad_request`, before anything is sent."""
    sent = {**base_headers, **(headers or {})}
    if json is not None:
        content = json_bytes(json)
        sent["content-type"] = "application/json"
    try:
        check_request(method, sent.items())
    except ValueError as exc:
        raise ClientError("bad_request", str(exc)) from None
    return Outgoing(
        quote(path, safe=PATH_SAFE),
        urlencode(params or {}),
        sent,
        content,
        base_timeout if isinstance(timeout, UseClientDefault) else timeout,
    )


def raise_refusal(resp: Response) -> None:
    """The API's refusal in `resp` (its `code` and `message`) as a ClientError."""
    body = resp.read()
    try:
        data = json.loads(body)
        raise ClientError(data["code"], data["message"], resp.status)
    except (ValueError, KeyError, TypeError):
        raise ClientError("http_error", f"HTTP {resp.status}", resp.status) from None


def json_bytes(value: Any) -> bytes:
    """A request's JSON body as the API reads it: compact, and no NaN (which is not JSON)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


@contextlib.contextmanager
def _transfer() -> Iterator[None]:
    """Reading a body: a broken or timed-out connection is a ClientError naming why."""
    try:
        yield
    except (OSError, ProtocolError) as exc:
        raise ClientError("transfer_failed", f"transfer failed: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "the control plane stopped sending (timed out)"
    return str(exc) or type(exc).__name__
