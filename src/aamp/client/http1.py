"""HTTP/1.1 on the wire, for the client's one connection: a request's bytes, and an answer's
head and body (framed by content-length, chunked, or by the connection's end).

The standard library's `http.client` does this too, but loads the e-mail parser (and `ssl`)
to read headers: ~30 ms that every CLI command would pay before its first byte. What this
module parses is only what a control plane sends, and everything it cannot read is a
`ProtocolError` naming what was wrong; the limits on a head are http.client's own.

    head, chunked = request_head("GET", "/v1/sandboxes", "127.0.0.1:8700", {...}, None)
    sock.sendall(head)
    head = read_head(sock.makefile("rb"))
    body = Body(file, head, method="GET")
    while chunk := body.read1(65536): ...
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from io import BufferedReader

MAX_LINE = 65536  # one line of a head, and one chunk-size line (http.client's _MAXLINE)
MAX_HEADERS = 100  # http.client's _MAXHEADERS
# Methods whose request without a body still says so (content-length: 0), as http.client does.
METHODS_EXPECTING_BODY = frozenset({"PATCH", "POST", "PUT"})
FORBIDDEN_IN_HEADERS = frozenset("\r\n\0")


class ProtocolError(Exception):
    """The other end sent something that is not an HTTP/1.1 answer this client can read."""


class ShortBody(ProtocolError):
    """The connection ended before the body its head announced."""

    def __init__(self, missing: int):
        super().__init__(f"the answer ended {missing} bytes short of its length")


class Headers:
    """An answer's header fields: names compared without case, a name may come more than once
    (set-cookie). `get` gives the first value, as `email.message.Message.get` does."""

    def __init__(self, fields: list[tuple[str, str]]):
        self._fields = fields  # (name in lower case, value)

    def get(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        return next((value for key, value in self._fields if key == name), default)

    def get_all(self, name: str) -> list[str] | None:
        name = name.lower()
        return [value for key, value in self._fields if key == name] or None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __repr__(self) -> str:
        return f"Headers({self._fields!r})"


class Head:
    """An answer's status line and header fields."""

    def __init__(self, version: str, status: int, reason: str, headers: Headers):
        self.version, self.status, self.reason, self.headers = version, status, reason, headers

    @property
    def keeps_alive(self) -> bool:
        """Whether the connection may carry another request once this answer's body is read."""
        tokens = (self.headers.get("connection") or "").lower().replace(",", " ").split()
        return self.version == "HTTP/1.1" and "close" not in tokens


def request_head(
    method: str, target: str, host: str, headers: dict[str, str], body: object
) -> tuple[bytes, bool]:
    """The request line and header fields, and whether the body is to be sent chunked. Framing
    is added as http.client adds it: a content-length for bytes, chunked for an iterable of
    bytes, unless the caller framed the body itself."""
    names = {name.lower() for name in headers}
    chunked = False
    fields = [] if "host" in names else [("Host", host)]
    if "accept-encoding" not in names:
        fields.append(("Accept-Encoding", "identity"))  # a body is never compressed
    fields.extend(headers.items())
    if "content-length" not in names and "transfer-encoding" not in names:
        if body is None:
            if method in METHODS_EXPECTING_BODY:
                fields.append(("Content-Length", "0"))
        elif isinstance(body, bytes | bytearray | memoryview):
            fields.append(("Content-Length", str(len(body))))
        else:
            fields.append(("Transfer-Encoding", "chunked"))
            chunked = True
    check_request(method, fields)
    lines = [f"{method} {target} HTTP/1.1", *(f"{name}: {value}" for name, value in fields)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), chunked


def check_request(method: str, fields: Iterable[tuple[str, str]]) -> None:
    """Refuse (ValueError) a request that cannot be sent as it is meant: a method that is not
    letters, a header name that is empty or holds a colon, a name or value with CR, LF or NUL.
    Every connection checks here, the socket's and the in-process one alike."""
    if not (method.isascii() and method.isalpha()):
        raise ValueError(f"{method!r} is not an HTTP method (letters only, as GET or PUT)")
    for name, value in fields:
        if not name or FORBIDDEN_IN_HEADERS & set(name + value) or ":" in name:
            # Refused rather than sent: a line break in a value would start a header (or a
            # request) of the value's choosing. The value itself is not repeated: it may be a
            # token.
            raise ValueError(f"the header {name!r} cannot be sent: it holds a line break or NUL")


def body_chunks(body: Iterable[bytes], *, chunked: bool) -> Iterator[bytes]:
    """What to send of an iterable body: its pieces, each framed when the body is chunked."""
    for piece in body:
        if not chunked:
            yield piece
        elif piece:  # an empty chunk would end the body
            yield b"%X\r\n%s\r\n" % (len(piece), piece)
    if chunked:
        yield b"0\r\n\r\n"


def read_head(file: BufferedReader) -> Head:
    """The next final answer's head (interim 1xx answers are read past)."""
    while True:
        line = _line(file)
        if not line:
            raise ProtocolError("the control plane closed the connection without answering")
        version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
        code, _, reason = rest.partition(" ")
        if version not in ("HTTP/1.0", "HTTP/1.1") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"the answer is not HTTP/1.1: {line[:40]!r}")
        head = Head(version, int(code), reason, Headers(_fields(file)))
        if not 100 <= head.status < 200:
            return head


def _fields(file: BufferedReader) -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    while True:
        line = _line(file)
        if line in (b"\r\n", b"\n"):
            return fields
        if not line:
            raise ProtocolError("the answer ended inside its head")
        text = line.decode("latin-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and fields:  # an obsolete folded line continues the last
            name, value = fields[-1]
            fields[-1] = (name, f"{value} {text.strip()}")
            continue
        name, colon, value = text.partition(":")
        if not colon or not name or name != name.strip():
            raise ProtocolError(f"a header line of the answer is malformed: {line[:40]!r}")
        if len(fields) == MAX_HEADERS:
            raise ProtocolError(f"the answer has more than {MAX_HEADERS} header lines")
        fields.append((name.lower(), value.strip()))


def _line(file: BufferedReader) -> bytes:
    line = file.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a line of the answer is longer than {MAX_LINE} bytes")
    return line


class Body:
    """An answer's body as its head frames it; `read1` gives what has arrived (up to `size`
    bytes, b"" at its end). A body that stops short of its framing raises, never ends
    quietly: a cut transfer is not a shorter file."""

    def __init__(self, file: BufferedReader, head: Head, *, method: str):
        self._file = file
        self._chunked = False
        self._chunk_left = 0  # chunked: bytes of the current chunk not yet read
        self.remaining: int | None = None  # content-length: bytes still owed; None: unknown
        self.done = False
        coding = (head.headers.get("transfer-encoding") or "").lower()
        length = head.headers.get("content-length")
        if method == "HEAD" or head.status in (204, 304):
            self.done = True
        elif coding:  # a content-length beside it is ignored (RFC 9112 6.3)
            self._chunked = coding.replace(" ", "").split(",")[-1] == "chunked"
        elif length is not None:
            lengths = {part.strip() for part in length.split(",")}
            if len(lengths) != 1 or not next(iter(lengths)).isdigit():
                raise ProtocolError(f"the answer's content-length is not a length: {length!r}")
            self.remaining = int(lengths.pop())
            self.done = self.remaining == 0

    @property
    def framed(self) -> bool:
        """Whether the body's end is known without the connection's end."""
        return self._chunked or self.remaining is not None or self.done

    def read1(self, size: int) -> bytes:
        if self.done:
            return b""
        if self._chunked:
            return self._read_chunked(size)
        if self.remaining is None:  # to the connection's end
            data = self._file.read1(size)
            self.done = not data
            return data
        data = self._file.read1(min(size, self.remaining))
        if not data:
            raise ShortBody(self.remaining)
        self.remaining -= len(data)
        self.done = self.remaining == 0
        return data

    def _read_chunked(self, size: int) -> bytes:
        if self._chunk_left == 0:
            line = _line(self._file)
            digits = line.split(b";", 1)[0].strip()
            try:
                self._chunk_left = int(digits, 16)
            except ValueError:
                if not line:
                    raise ProtocolError("the answer ended before its last chunk") from None
                raise ProtocolError(f"a chunk's size is not a number: {line[:40]!r}") from None
            if self._chunk_left < 0:
                raise ProtocolError(f"a chunk's size is not a number: {line[:40]!r}")
            if self._chunk_left == 0:
                _fields(self._file)  # the trailer section, not used
                self.done = True
                return b""
        data = self._file.read1(min(size, self._chunk_left))
        if not data:
            raise ProtocolError("the answer ended inside a chunk")
        self._chunk_left -= len(data)
        if self._chunk_left == 0 and _line(self._file) not in (b"\r\n", b"\n"):
            raise ProtocolError("a chunk is longer than its size says")
        return data
