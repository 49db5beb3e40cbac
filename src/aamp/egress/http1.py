"""HTTP/1.x as the egress proxy speaks it: strict parsing of what arrives, and serialising.

Trust: every byte from the client — and from an upstream — is hostile. Request heads refuse
bare CR/LF, NUL, obs-fold, duplicate Host, Host vs absolute-URI disagreement, Content-Length
with Transfer-Encoding, userinfo, fragments and any host the rules module cannot bring to one
canonical spelling. Chunked bodies (either way) are walked by `chunked_framing`, which checks
every chunk-size line (hex size, then only well-formed `;name[=value]` extensions) and every
trailer field line before handing it on: a bare CR or LF anywhere in them is refused, so no
byte of framing reaches the other side unless it parsed here.

A refusal is a `Refusal` (status, the rule that refused, a reason in words); `refusal_response`
serialises it for the client. A connection that ends before a request's first byte raises
`NoRequest` instead: there is nothing to answer, but it is still recorded.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NamedTuple

from aamp.egress.limits import ProxyLimits
from aamp.policy.hosts import Host, HostError, normalize_host, parse_port, split_host_port

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TOKEN_RE = re.compile(rb"^" + _TOKEN + rb"\Z")
_TARGET_RE = re.compile(rb"^[\x21-\x7e]+\Z")
_FIELD_VALUE_RE = re.compile(rb"^[\t\x20-\x7e\x80-\xff]*\Z")
_STATUS_LINE_RE = re.compile(rb"^HTTP/1\.[01] [1-5][0-9]{2}(?: [\t\x20-\x7e\x80-\xff]*)?\Z")
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t\x20-\x7e\x80-\xff])*"'
# RFC 9112 7.1: chunk-size [ chunk-ext ], chunk-ext = *( BWS ";" BWS name [ BWS "=" BWS value ] )
_CHUNK_LINE_RE = re.compile(
    rb"^([0-9A-Fa-f]{1,16})((?:[ \t]*;[ \t]*"
    + _TOKEN
    + rb"(?:[ \t]*=[ \t]*(?:"
    + _TOKEN
    + rb"|"
    + _QUOTED
    + rb"))?)*)\Z"
)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)
REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    414: "URI Too Long",
    417: "Expectation Failed",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
    501: "Not Implemented",
    502: "Bad Gateway",
    504: "Gateway Timeout",
}
MALFORMED_RULE = "client: malformed"
UPSTREAM_MALFORMED_RULE = "upstream: malformed"


class Refusal(Exception):
    """Stop this attempt and answer `status`; `rule`/`reason` go to the client and ledger."""

    def __init__(self, status: int, rule: str, reason: str, *, host: str = "", port=None):
        super().__init__(reason)
        self.status = status
        self.rule = rule
        self.reason = reason
        self.host = host
        self.port = port


class NoRequest(Exception):
    """The connection ended, or idled out, before the first byte of a request."""

    def __init__(self, rule: str, reason: str):
        super().__init__(reason)
        self.rule = rule
        self.reason = reason


def clean(text: str, limit: int = 200) -> str:
    """Text safe for a header value or a plain-text body: printable ASCII only."""
    out = "".join(ch if 0x20 <= ord(ch) < 0x7F else "?" for ch in text)
    return out[:limit]


def refusal_response(refusal: Refusal) -> bytes:
    """The whole response that tells the client which rule refused it, and closes."""
    rule = clean(refusal.rule)
    body = f"aamp egress refused: {clean(refusal.reason, 400)}\nrule: {rule}\n".encode()
    head = (
        f"HTTP/1.1 {refusal.status} {REASONS.get(refusal.status, 'Error')}\r\n"
        f"X-Aamp-Egress-Rule: {rule}\r\n"
        "Content-Type: text/plain; charset=us-ascii\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    return head + body


class Framing(NamedTuple):
    """How a message body is delimited: `none`, `length` (`length` bytes), `chunked`, `eof`."""

    kind: str
    length: int = 0


@dataclass
class RequestHead:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]  # (lower-case name, value)
    raw_names: list[str]

    def get_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]

    def get(self, name: str) -> str | None:
        values = self.get_all(name)
        return values[0] if values else None

    def connection_tokens(self) -> set[str]:
        tokens: set[str] = set()
        for value in self.get_all("connection") + self.get_all("proxy-connection"):
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
        return tokens


@dataclass
class ResponseHead:
    status_line: str
    version: str
    status: int
    headers: list[tuple[str, str]]
    raw_names: list[str]
    raw: bytes

    def get_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]

    def connection_tokens(self) -> set[str]:
        tokens: set[str] = set()
        for value in self.get_all("connection"):
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
        return tokens


# -- request heads ---------------------------------------------------------------------------


async def read_request_head(reader: asyncio.StreamReader, limits: ProxyLimits) -> RequestHead:
    """The next request head. `NoRequest` if the client closed or stayed idle before sending
    a byte of it; `Refusal` for a head that is incomplete, slow, too large or malformed."""
    try:
        async with asyncio.timeout(limits.idle_timeout):
            start = await reader.read(1)
    except TimeoutError:
        raise NoRequest(
            "client: idle",
            f"no request within {limits.idle_timeout:g} s; the proxy closed the connection",
        ) from None
    except ConnectionError:
        start = b""
    if not start:
        raise NoRequest("client: no request", "the client closed the connection before a request")
    try:
        if _buffered_head(reader):  # nothing to wait for: no timer to arm (~10 us a request)
            rest = await reader.readuntil(b"\r\n\r\n")
        else:
            async with asyncio.timeout(limits.header_timeout):
                rest = await reader.readuntil(b"\r\n\r\n")
    except TimeoutError:
        raise Refusal(
            408, "client: header timeout", "the request head did not arrive in time"
        ) from None
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        got = 1 + len(getattr(exc, "partial", b""))
        raise Refusal(
            400,
            "client: incomplete head",
            f"the client ended the connection after {got} bytes of a request head",
        ) from None
    except asyncio.LimitOverrunError:
        buffered = start + await reader.read(limits.max_head_bytes)
        if b"\r\n" not in buffered[: limits.max_request_line + 2]:
            raise Refusal(
                414, "client: request line too long", "the request line is too long"
            ) from None
        raise Refusal(
            431, "client: header too large", "the request header block is too large"
        ) from None
    data = start + rest
    if len(data) > limits.max_head_bytes:
        raise Refusal(431, "client: header too large", "the request header block is too large")
    return parse_request_head(data[:-4], limits)


def _buffered_head(reader: asyncio.StreamReader) -> bool:
    """Whether the reader already holds the end of a head (a kept-alive client's request
    usually arrives whole): then `readuntil` returns, or refuses, without waiting."""
    buffer = getattr(reader, "_buffer", None)  # StreamReader keeps read-ahead here
    return isinstance(buffer, bytearray) and b"\r\n\r\n" in buffer


def parse_request_head(data: bytes, limits: ProxyLimits) -> RequestHead:
    lines = data.split(b"\r\n")
    request_line = lines[0]
    if len(request_line) > limits.max_request_line:
        raise Refusal(414, "client: request line too long", "the request line is too long")
    if len(lines) - 1 > limits.max_headers:
        raise Refusal(431, "client: too many headers", "too many header fields")
    for line in lines:
        if b"\r" in line or b"\n" in line or b"\x00" in line:
            raise Refusal(400, MALFORMED_RULE, "bare CR, LF or NUL in the request head")
    parts = request_line.split(b" ")
    if len(parts) != 3:
        raise Refusal(400, MALFORMED_RULE, "the request line is not METHOD TARGET VERSION")
    method, target, version = parts
    if not _TOKEN_RE.match(method) or not _TARGET_RE.match(target):
        raise Refusal(400, MALFORMED_RULE, "bad characters in the request line")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise Refusal(400, MALFORMED_RULE, "only HTTP/1.1 and HTTP/1.0 are spoken")
    headers: list[tuple[str, str]] = []
    raw_names: list[str] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise Refusal(400, MALFORMED_RULE, "obsolete header folding is refused")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN_RE.match(name) or not _FIELD_VALUE_RE.match(value):
            raise Refusal(400, MALFORMED_RULE, "a header line is malformed")
        raw_names.append(name.decode("ascii"))
        headers.append((name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1")))
    head = RequestHead(method.decode(), target.decode(), version.decode(), headers, raw_names)
    if len(head.get_all("host")) > 1:
        raise Refusal(400, "client: duplicate host", "more than one Host header")
    return head


def parse_authority(text: str, default_port: int | None) -> tuple[Host, int]:
    """(canonical host, port) of `host[:port]`; `default_port` None means a port is required."""
    try:
        return _authority(text, default_port)
    except HostError as exc:
        raise Refusal(400, "client: bad target", str(exc), host=clean(text, 100)) from None


@functools.lru_cache(maxsize=1024)
def _authority(text: str, default_port: int | None) -> tuple[Host, int]:
    # Every request names its place two or three times (target, Host header, a tunnel's
    # SNI) and a connection names the same few places again and again: parsing is a pure
    # function of the text, so its answers are kept (bounded; a refusal is never kept).
    host_text, port_text = split_host_port(text)
    if port_text is None:
        if default_port is None:
            raise HostError(f"{text!r} has no port")
        port = default_port
    else:
        port = parse_port(port_text)
    return normalize_host(host_text), port


def check_host_header(head: RequestHead, host: Host, port: int, default_port: int) -> None:
    """A Host header, if any, must name the place the target names."""
    value = head.get("host")
    if value is None:
        if head.version == "HTTP/1.1" and head.method != "CONNECT":
            raise Refusal(400, "client: missing host", "HTTP/1.1 requires a Host header")
        return
    if parse_authority(value, default_port) != (host, port):
        raise Refusal(
            400,
            "client: host mismatch",
            f"the Host header ({clean(value, 100)}) names another place than the target",
            host=str(host),
            port=port,
        )


def split_origin(rest: str) -> tuple[str, str]:
    """(authority, origin-form path) of a URI with its `scheme://` removed."""
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        raise Refusal(400, "client: bad target", "userinfo in the URI is refused")
    if path.startswith("?") or path == "":
        path = "/" + path
    return authority, path


def absolute_target(target: str) -> tuple[Host, int, str, str]:
    """(host, port, authority text, origin-form path) from `http://authority/path?q`."""
    if not target.lower().startswith("http://"):
        if target.lower().startswith("https://"):
            raise Refusal(400, "client: bad target", "https:// needs CONNECT")
        raise Refusal(400, "client: bad target", "a proxy request needs an absolute http:// URI")
    rest = target[7:]
    if "#" in rest:
        raise Refusal(400, "client: bad target", "a fragment is not sent in a request")
    authority, path = split_origin(rest)
    host, port = parse_authority(authority, 80)
    return host, port, authority, path


def request_framing(head: RequestHead) -> Framing:
    te = head.get_all("transfer-encoding")
    cl = head.get_all("content-length")
    if te and cl:
        raise Refusal(400, MALFORMED_RULE, "both Transfer-Encoding and Content-Length")
    if te:
        if len(te) != 1 or te[0].strip().lower() != "chunked":
            raise Refusal(501, MALFORMED_RULE, "only Transfer-Encoding: chunked")
        return Framing("chunked")
    if cl:
        return _by_length(cl, Refusal(400, MALFORMED_RULE, "bad Content-Length"))
    return Framing("none")


def _by_length(values: list[str], refusal: Refusal) -> Framing:
    """Content-Length framing: every value the same decimal number, else `refusal`."""
    distinct = {v.strip() for v in values}
    if len(distinct) != 1 or not next(iter(distinct)).isdigit():
        raise refusal
    return Framing("length", int(next(iter(distinct))))


# -- response heads --------------------------------------------------------------------------


async def read_response_head(reader: asyncio.StreamReader, limits: ProxyLimits) -> ResponseHead:
    try:
        async with asyncio.timeout(limits.response_timeout):
            data = await reader.readuntil(b"\r\n\r\n")
    except TimeoutError:
        raise Refusal(504, "upstream: timeout", "the upstream did not answer in time") from None
    except (asyncio.IncompleteReadError, ConnectionError):
        raise Refusal(502, "upstream: closed", "the upstream closed without a response") from None
    except asyncio.LimitOverrunError:
        raise Refusal(
            502, UPSTREAM_MALFORMED_RULE, "the upstream response head is too large"
        ) from None
    if len(data) > 4 * limits.max_head_bytes:
        raise Refusal(502, UPSTREAM_MALFORMED_RULE, "the upstream response head is too large")
    lines = data[:-4].split(b"\r\n")
    if not _STATUS_LINE_RE.match(lines[0]) or any(
        b"\r" in line or b"\n" in line or b"\x00" in line for line in lines
    ):
        raise Refusal(502, UPSTREAM_MALFORMED_RULE, "the upstream sent a malformed response")
    headers: list[tuple[str, str]] = []
    raw_names: list[str] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN_RE.match(name) or line[:1] in (b" ", b"\t"):
            raise Refusal(502, UPSTREAM_MALFORMED_RULE, "the upstream sent a malformed header")
        raw_names.append(name.decode("ascii"))
        headers.append((name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1")))
    status_line = lines[0].decode("latin-1")
    status = int(status_line[9:12])
    return ResponseHead(status_line, status_line[:8], status, headers, raw_names, data)


def response_framing(method: str, response: ResponseHead) -> Framing:
    status = response.status
    if method == "HEAD" or status in (204, 304):
        return Framing("none")
    te = response.get_all("transfer-encoding")
    if te:
        if te[-1].strip().lower().split(",")[-1].strip() != "chunked":
            return Framing("eof")
        return Framing("chunked")
    cl = response.get_all("content-length")
    if cl:
        bad = Refusal(502, UPSTREAM_MALFORMED_RULE, "upstream sent a bad Content-Length")
        return _by_length(cl, bad)
    return Framing("eof")


# -- chunked bodies --------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkData:
    """`size` bytes of chunk data come next on the source; the caller moves them itself."""

    size: int


def _malformed(from_upstream: bool, reason: str) -> Refusal:
    if from_upstream:
        return Refusal(502, UPSTREAM_MALFORMED_RULE, f"{reason} from upstream")
    return Refusal(400, MALFORMED_RULE, reason)


async def _line(
    source: asyncio.StreamReader, longest: int, from_upstream: bool, what: str
) -> bytes:
    """One CRLF-terminated line of framing, CRLF included; a bare CR or LF inside is refused."""
    try:
        line = await source.readuntil(b"\r\n")
    except asyncio.LimitOverrunError:
        raise _malformed(from_upstream, f"{what} is too long") from None
    if len(line) > longest + 2:
        raise _malformed(from_upstream, f"{what} is too long")
    if b"\r" in line[:-2] or b"\n" in line[:-2] or b"\x00" in line:
        raise _malformed(from_upstream, f"bare CR, LF or NUL in a {what}")
    return line


def trailer_problem(line: bytes) -> str | None:
    """Why a trailer field line (without its CRLF) is refused, or None."""
    if line[:1] in (b" ", b"\t"):
        return "obsolete folding in a trailer"
    name, sep, value = line.partition(b":")
    if not sep or not _TOKEN_RE.match(name) or not _FIELD_VALUE_RE.match(value):
        return "a trailer line is malformed"
    return None


async def chunked_framing(
    source: asyncio.StreamReader, limits: ProxyLimits, *, from_upstream: bool
) -> AsyncIterator[bytes | ChunkData]:
    """Walk a chunked body: yields each piece of framing (a chunk-size line, the CRLF after a
    chunk's data, each trailer line and the final CRLF) only once it has been checked, and a
    `ChunkData` for each chunk's data, which the caller must consume from `source` before
    asking for the next piece. Raises `Refusal` (400 from the client, 502 from an upstream)
    at the first byte that does not parse, before yielding it."""
    while True:
        line = await _line(source, limits.max_request_line, from_upstream, "chunk-size line")
        match = _CHUNK_LINE_RE.match(line[:-2])
        if match is None:
            raise _malformed(from_upstream, "bad chunk size")
        size = int(match.group(1), 16)
        yield line
        if size == 0:
            break
        yield ChunkData(size)
        if await source.readexactly(2) != b"\r\n":
            raise _malformed(from_upstream, "chunk not followed by CRLF")
        yield b"\r\n"
    trailer_bytes = 0
    for _ in range(limits.max_headers + 1):  # trailer fields, then the final CRLF
        line = await _line(source, limits.max_head_bytes, from_upstream, "trailer line")
        if line == b"\r\n":
            yield line
            return
        trailer_bytes += len(line)
        problem = trailer_problem(line[:-2])
        if problem is None and trailer_bytes > limits.max_head_bytes:
            problem = "the trailer block is too large"
        if problem is not None:
            raise _malformed(from_upstream, problem)
        yield line
    raise _malformed(from_upstream, "too many trailer fields")
