"""One keep-alive HTTP/1.1 connection to the control plane, its failures as `ClientError`.

HTTP is spoken here over a plain socket, not through an HTTP package or `http.client`: a CLI
command's budget is 150 ms, importing httpx alone takes longer, and `http.client` (with the
`email` and `ssl` packages it loads) a sixth of it. What the control plane needs is a small,
strict part of HTTP/1.1, and only that is accepted:
- requests have a known length (`content-length`; an upload's is given by the caller and the
  bytes sent are held to it), and header values cannot hold line breaks;
- answers: a status line, at most `MAX_HEAD` bytes of head (interim 1xx answers skipped), and
  a body framed by `content-length`, by `transfer-encoding: chunked` (extensions and trailers
  read and ignored) or, with neither, by the server's close. Anything else — another transfer
  coding, a malformed length, a chunk that does not end as declared, a body cut short — is a
  failed transfer, never a shorter body. No TLS and no proxies: the API is plain HTTP.

What the API answers with a non-2xx status is raised as a `ClientError` with the API's own
`code` and `message`; a control plane that cannot be reached, does not answer in time or
breaks off is a `ClientError` too, so callers handle one kind of error. An upload the server
refuses before reading it (by its size) gets the server's refusal, not a broken pipe.

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
from collections.abc import Callable, Iterable, Iterator
from urllib.parse import quote, urlencode, urlsplit

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from io import BufferedReader
    from typing import Any

CONNECT_TIMEOUT = 5.0
MAX_LINE = 8 * 1024  # a status line, a header line, a chunk's size line
MAX_HEAD = 64 * 1024  # an answer's status line and headers, or a chunked body's trailers
READ_SIZE = 64 * 1024
# RFC 3986 pchar and "/", plus "%" so a caller's own escapes (an artifact's quoted name) stay.
PATH_SAFE = "/%:@!$&'()*+,;="
HEX = frozenset(b"0123456789abcdefABCDEF")
BODY_METHODS = ("POST", "PUT", "PATCH")


class UseClientDefault:
    """The type of `USE_CLIENT_DEFAULT`: a request's timeout left to the connection's own."""


USE_CLIENT_DEFAULT = UseClientDefault()
Timeout = float | None | UseClientDefault  # seconds; None: wait as long as it takes


class ClientError(Exception):
    """The API refused (its `code` and `message`), or could not be reached or read."""

    def __init__(self, code: str, message: str, status: int = 0):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def _broken(reason: str) -> ClientError:
    return ClientError("transfer_failed", f"transfer failed: {reason}")


class Response:
    """An answer whose body is read as the caller asks. `headers` maps lower-case names to
    values (repeated headers joined by ", "); read errors are `ClientError`s."""

    def __init__(
        self,
        file: BufferedReader,
        status: int,
        headers: dict[str, str],
        *,
        length: int | None,
        chunked: bool,
        release: Callable[[bool], None],
    ):
        self.status, self.headers = status, headers
        self._file = file
        self._left = length  # bytes of the body still to come; None: until the close
        self._chunked, self._chunk_left = chunked, 0
        self._release = release  # told once, at the body's end: whether the connection stays
        self._done = False
        self._body: bytes | None = None
        if length == 0 and not chunked:
            self._finish(keep=True)

    @property
    def complete(self) -> bool:
        """Whether the whole body has been read (the connection may then carry another)."""
        return self._done

    def read(self) -> bytes:
        """The rest of the body (kept: a second call returns the same bytes)."""
        if self._body is None:
            self._body = b"".join(self.iter_bytes())
        return self._body

    def json(self) -> Any:
        body = self.read()
        return json.loads(body) if body else None

    def iter_bytes(self, size: int = READ_SIZE) -> Iterator[bytes]:
        """The body in pieces of at most `size` bytes, each as soon as it has arrived."""
        while chunk := self._read1(size):
            yield chunk

    def iter_lines(self) -> Iterator[str]:
        """The body's lines as text, without their line ends ("\\n" or "\\r\\n"), each as soon
        as it is complete."""
        pending = b""
        for chunk in self.iter_bytes():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8").removesuffix("\r")
        if pending:
            yield pending.decode("utf-8")

    def _read1(self, size: int) -> bytes:
        if self._done:
            return b""
        with _transfer():
            if self._chunked:
                return self._read_chunked(size)
            if self._left is None:
                data = self._file.read1(size)
                if not data:
                    self._finish(keep=False)  # the close was the end
                return data
            data = self._file.read1(min(size, self._left))
            if not data:
                raise _broken(f"the answer ended {self._left} bytes short of its length")
            self._left -= len(data)
            if self._left == 0:
                self._finish(keep=True)
            return data

    def _read_chunked(self, size: int) -> bytes:
        if self._chunk_left == 0:
            line = _line(self._file, "a chunk's size")
            digits = line.split(b";", 1)[0].strip()
            if not digits or not HEX.issuperset(digits):
                raise _broken(f"a chunk's size is not hexadecimal: {line[:40]!r}")
            self._chunk_left = int(digits, 16)
            if self._chunk_left == 0:
                _skip_head_lines(self._file, "the trailers")
                self._finish(keep=True)
                return b""
        data = self._file.read1(min(size, self._chunk_left))
        if not data:
            raise _broken("the answer ended inside a chunk")
        self._chunk_left -= len(data)
        if self._chunk_left == 0 and self._file.read(2) != b"\r\n":
            raise _broken("a chunk is longer than its size said")
        return data

    def _finish(self, *, keep: bool) -> None:
        self._done = True
        self._release(keep)


class Connection:
    """Requests to one control plane, one at a time, over one reused connection."""

    def __init__(self, base_url: str, headers: dict[str, str], *, timeout: float | None):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ClientError("bad_url", f"{base_url}: the API's address must be http://HOST:PORT")
        self.base = base_url
        self.timeout = timeout
        self._address = (parts.hostname, parts.port or 80)
        self._host = parts.netloc
        _check_headers(headers)
        self._headers = headers
        self._sock: socket.socket | None = None
        self._file: BufferedReader | None = None
        self._reusable = False  # the last answer was read to its end, and may be followed

    def close(self) -> None:
        # The reader first: a socket with a file still open on it is not really closed.
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None
        self._reusable = False

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
        target = quote(path, safe=PATH_SAFE)
        if params:
            target += "?" + urlencode(params)
        extra = {k.lower(): v for k, v in (headers or {}).items()}
        _check_headers(extra)
        if json is not None:
            content = _json_bytes(json)
            extra["content-type"] = "application/json"
        if isinstance(content, bytes):
            extra["content-length"] = str(len(content))
        elif content is None and method in BODY_METHODS:
            extra["content-length"] = "0"
        elif content is not None and not extra.get("content-length", "").isdigit():
            raise ValueError("a streamed request body needs its content-length")
        lines = [f"{method} {target} HTTP/1.1", f"host: {self._host}"]
        lines += [f"{k}: {v}" for k, v in {**self._headers, **extra}.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        wait = self.timeout if isinstance(timeout, UseClientDefault) else timeout
        self._connect(unreachable_hint)
        try:
            assert self._sock is not None and self._file is not None
            self._sock.settimeout(wait)
            whole = self._send(head, content, int(extra.get("content-length", 0)))
            resp = self._answer(method, keep=whole)
        except TimeoutError:
            self.close()
            raise ClientError(
                "timed_out", f"the control plane did not answer within {wait:g} s"
            ) from None
        except OSError as exc:
            self.close()
            raise _broken(str(exc) or type(exc).__name__) from None
        except BaseException:
            self.close()
            raise
        if not 200 <= resp.status < 300:
            _raise_refusal(resp)
        return resp

    def _connect(self, unreachable_hint: str) -> None:
        if self._sock is not None and (
            not self._reusable or select.select([self._sock], [], [], 0)[0]
        ):
            # Not at a request's boundary, or readable while idle: the server closed its end
            # (a keep-alive timeout) or sent what nobody asked for. Either way, start afresh.
            self.close()
        if self._sock is None:
            try:
                self._sock = socket.create_connection(self._address, timeout=CONNECT_TIMEOUT)
            except OSError:
                raise ClientError(
                    "unreachable",
                    f"the control plane is not reachable at {self.base}{unreachable_hint}",
                ) from None
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._file = self._sock.makefile("rb", buffering=READ_SIZE)
        self._reusable = False

    def _send(self, head: bytes, body: bytes | Iterable[bytes] | None, length: int) -> bool:
        """Send the request; False if the server stopped reading its body (it may have
        answered first: an upload refused by its size is, and that answer is what counts)."""
        assert self._sock is not None
        try:
            if body is None or isinstance(body, bytes):
                self._sock.sendall(head + (body or b""))
                return True
            self._sock.sendall(head)
            sent = 0
            for chunk in body:
                sent += len(chunk)
                if sent > length:
                    raise ValueError(f"the body grew past the {length} bytes announced")
                self._sock.sendall(chunk)
            if sent != length:
                raise ValueError(f"the body ended at {sent} of the {length} bytes announced")
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def _answer(self, method: str, *, keep: bool) -> Response:
        assert self._file is not None
        try:
            version, status, headers = _read_head(self._file)
        except (OSError, ClientError):
            if keep:
                raise
            raise _broken("the control plane stopped reading the request") from None
        keep = keep and version == "HTTP/1.1" and "close" not in _tokens(headers, "connection")
        length: int | None = None
        chunked = False
        if method == "HEAD" or status in (204, 304):
            length = 0
        elif "transfer-encoding" in headers:
            if _tokens(headers, "transfer-encoding") != ["chunked"]:
                raise _broken(f"transfer-encoding {headers['transfer-encoding']!r} is not spoken")
            chunked = True
        elif "content-length" in headers:
            text = headers["content-length"]
            if not text.isascii() or not text.isdigit():
                raise _broken(f"content-length {text!r} is not a length")
            length = int(text)
        else:
            keep = False  # the body ends when the server closes
        return Response(
            self._file, status, headers, length=length, chunked=chunked, release=self._ended(keep)
        )

    def _ended(self, keep: bool) -> Callable[[bool], None]:
        file = self._file

        def release(body_allows: bool) -> None:
            if self._file is not file:
                return  # an answer on a connection closed since: nothing of it is left
            if keep and body_allows:
                self._reusable = True
            else:
                self.close()

        return release


def _read_head(file: BufferedReader) -> tuple[str, int, dict[str, str]]:
    """The status line and headers of the next final answer (interim 1xx ones skipped)."""
    while True:
        line = _line(file, "the status line", eof_ok=True)
        if not line:
            raise _broken("the control plane closed the connection without an answer")
        version, _, rest = line.decode("latin-1").partition(" ")
        code = rest.partition(" ")[0].rstrip("\r\n")
        if version not in ("HTTP/1.1", "HTTP/1.0") or not (
            len(code) == 3 and code.isascii() and code.isdigit()
        ):
            raise _broken(f"not an HTTP/1.1 answer: {line[:40]!r}")
        headers = _head_lines(file)
        if not 100 <= int(code) < 200:
            return version, int(code), headers


def _head_lines(file: BufferedReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    total = 0
    while True:
        line = _line(file, "a header")
        total += len(line)
        if total > MAX_HEAD:
            raise _broken(f"the answer's head is longer than {MAX_HEAD} bytes")
        if line in (b"\r\n", b"\n"):
            return headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip():
            raise _broken(f"not a header: {line[:40]!r}")
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value


def _skip_head_lines(file: BufferedReader, what: str) -> None:
    try:
        _head_lines(file)
    except ClientError as exc:
        raise _broken(f"{what}: {exc.message.removeprefix('transfer failed: ')}") from None


def _line(file: BufferedReader, what: str, *, eof_ok: bool = False) -> bytes:
    line = file.readline(MAX_LINE + 1)
    if not line and eof_ok:
        return line
    if len(line) > MAX_LINE:
        raise _broken(f"{what} is longer than {MAX_LINE} bytes")
    if not line.endswith(b"\n"):
        raise _broken(f"the answer ended inside {what}")
    return line


def _tokens(headers: dict[str, str], name: str) -> list[str]:
    return [t.strip().lower() for t in headers.get(name, "").split(",") if t.strip()]


def _check_headers(headers: dict[str, str]) -> None:
    for name, value in headers.items():
        if any(c in f"{name}{value}" for c in "\r\n\0") or not name or ":" in name:
            raise ClientError("bad_header", f"the {name!r} header cannot hold line breaks")


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
    except TimeoutError:
        raise _broken("the control plane stopped sending (timed out)") from None
    except OSError as exc:
        raise _broken(str(exc) or type(exc).__name__) from None
