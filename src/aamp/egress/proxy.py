"""The egress proxy: the only way out of a sandbox, one listener per sandbox on a Unix socket.

The sandbox's channel (a Unix socket bound into a gVisor sandbox, or a vsock port forwarded
by Firecracker) carries the guest's bytes to `socket_path`; there is no TCP port a guest could
reach. Two kinds of request are served:

- `CONNECT host:port` opens a byte tunnel (HTTPS, websockets over TLS, anything over TCP);
- absolute-form plain HTTP (`GET http://host/path HTTP/1.1`), forwarded with HTTP/1.1
  keep-alive; every request on a kept-alive connection is judged again. Heads always go
  through the parser; a large body between them (Content-Length, a big chunk, or until close)
  is moved by splice(2) (`splice.py`), its length and the byte cap still enforced here.

For each attempt: parse strictly → `EgressRules.decide(host, port)` (a `default: ask`
destination is put to a person first, see `approvals.py`) → resolve once on the host →
`check_address` on every resolved address → connect to an address that passed (never a
second lookup) → relay, counting bytes each way → one `EgressEvent` to the sink. A refusal is
an HTTP response: 403 for policy (body and `X-Aamp-Egress-Rule` name the rule), 400 for a
malformed request, 408 for a client too slow to send its header, 414/431 for an over-long
request line / header block, 502 for upstream failures, 504 for upstream timeouts.

Trust: every byte from the client is hostile. Parsing refuses bare CR/LF, NUL, obs-fold,
duplicate Host, Host vs absolute-URI disagreement, Content-Length with Transfer-Encoding,
userinfo, fragments and any host the rules module cannot bring to one canonical spelling.

Credential injection (see `intercept.py`, `services.py`, `scrub.py`): a CONNECT to a granted
service's exact (host, port) is decided, resolved and address-checked like any tunnel, then
the proxy terminates its TLS with a leaf from the installation CA and keeps serving the inner
requests with the same loop and parser (`_serve_requests`), each judged again, sent to the
upstream over TLS the proxy verifies, with the credential added and the secret scrubbed from
the response. A plain-HTTP request to a service host gets the same treatment (and TLS upstream
if the service's upstream is https). No other host is ever injected. The ledger event of a
service call names the service and the secret names used, never a value.

`max_bytes_out` is a per-sandbox cap on bytes sent upstream across all connections (a
per-connection cap would be bypassed by opening more connections). The connection that
crosses it is cut, and later attempts are refused with rule `egress.max_bytes_out`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import socket
import ssl
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aamp.egress import splice
from aamp.egress.addresses import IPAddress
from aamp.egress.approvals import EgressApprovals
from aamp.egress.ca import InstallationCA
from aamp.egress.intercept import (
    CREDENTIAL_RULE,
    HANDSHAKE_RULE,
    HOST_MISMATCH_RULE,
    NOT_GRANTED_RULE,
    Intercepted,
    intercepted,
    tls_server_name,
    upstream_tls_context,
)
from aamp.egress.ledger import EgressEvent, EgressSink
from aamp.egress.resolver import ResolveError, Resolver
from aamp.egress.rules import (
    Decision,
    EgressRules,
    Host,
    HostError,
    normalize_host,
    parse_port,
    split_host_port,
)
from aamp.egress.scrub import BodyDecoder, Scrubber, UnsupportedEncoding
from aamp.egress.services import (
    Credential,
    CredentialError,
    SecretReader,
    Service,
    ServiceSet,
    render,
)
from aamp.egress.splice import CapReached as _Cut  # max_bytes_out crossed: cut

log = logging.getLogger(__name__)

_TOKEN_RE = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_TARGET_RE = re.compile(rb"^[\x21-\x7e]+$")
_FIELD_VALUE_RE = re.compile(rb"^[\t\x20-\x7e\x80-\xff]*$")
_STATUS_LINE_RE = re.compile(rb"^HTTP/1\.[01] [1-5][0-9]{2}(?: [\t\x20-\x7e\x80-\xff]*)?$")
_HOP_BY_HOP = frozenset(
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
_REASONS = {
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
MAX_BYTES_RULE = "egress.max_bytes_out"
# Response headers dropped when a service response is scrubbed: its bytes change.
_BODY_DIGESTS = frozenset({"content-md5", "digest", "content-digest", "repr-digest"})


@dataclass(frozen=True)
class ProxyLimits:
    """Parsing and timing limits. Header sizes count the whole head including the final CRLF."""

    max_request_line: int = 8 * 1024
    max_head_bytes: int = 32 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0  # whole request head, from its first byte (slowloris)
    idle_timeout: float = 120.0  # waiting for a request's first byte; then closed silently
    max_connections: int = 512  # open client connections per sandbox
    connect_timeout: float = 10.0
    response_timeout: float = 60.0  # upstream response head after the request was sent
    chunk_bytes: int = 256 * 1024
    # SO_SNDBUF of the guest's end (the kernel caps it at net.core.wmem_max and doubles it).
    # The default ~208 KiB makes every large response a stream of short socket writes and
    # wake-ups; 4 MiB roughly halves the proxy's CPU per byte on TLS interception. Worst case
    # kernel memory for a guest that stops reading: max_connections x 2 x this. 0: leave it.
    guest_send_buffer: int = 4 * 1024 * 1024


@dataclass
class _Counters:
    bytes_up: int = 0
    bytes_down: int = 0
    attempts: int = 0
    refused: int = 0


@dataclass(frozen=True)
class EgressStats:
    """A snapshot of one sandbox's egress: bytes sent up (guest → world) and down."""

    bytes_up: int
    bytes_down: int
    attempts: int
    refused: int
    open_connections: int


class _Refusal(Exception):
    """Stop this attempt and answer `status`; `rule`/`reason` go to the client and ledger."""

    def __init__(self, status: int, rule: str, reason: str, *, host: str = "", port=None):
        super().__init__(reason)
        self.status = status
        self.rule = rule
        self.reason = reason
        self.host = host
        self.port = port


@dataclass
class _Attempt:
    """What the ledger needs to know about one request/tunnel as it happens."""

    kind: str
    started: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)
    host: str = ""
    port: int | None = None
    address: str | None = None
    decision: Decision | None = None
    status: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    cut: bool = False
    emitted: bool = False
    service: str | None = None
    secrets: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.decision is not None and self.decision.allowed

    @property
    def reason(self) -> str:
        return self.decision.reason if self.decision is not None else ""


@dataclass
class _Head:
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
class _Upstream:
    host: Host
    port: int
    address: IPAddress
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    tls: bool = False


def _all(wanted: int) -> int:
    """No byte budget (bytes down are not capped)."""
    return wanted


def _clean(text: str, limit: int = 200) -> str:
    """Text safe for a header value or a plain-text body: printable ASCII only."""
    out = "".join(ch if 0x20 <= ord(ch) < 0x7F else "?" for ch in text)
    return out[:limit]


class EgressProxy:
    """One sandbox's egress proxy. Usage::

    proxy = EgressProxy("sb-0123456789ab", sock_path, rules, StaticResolver({...}), sink)
    await proxy.start()
    ...                                # the guest's forwarder dials sock_path
    proxy.update_rules(new_rules)      # applies to the next connection / request
    proxy.update_services(services)    # the same, for the granted services
    await proxy.close()                # stops, cuts connections, waits for the ledger

    Credential injection needs `services` (a `ServiceSet`), `secrets` (a `SecretReader`, e.g.
    `VaultSecretReader(vault)`) and `ca` (the `InstallationCA`); `upstream_tls` is how service
    upstreams are verified (default: the system trust store, see `upstream_tls_context`).
    """

    def __init__(
        self,
        sandbox_id: str,
        socket_path: Path,
        rules: EgressRules,
        resolver: Resolver,
        sink: EgressSink,
        limits: ProxyLimits | None = None,
        *,
        services: ServiceSet | None = None,
        secrets: SecretReader | None = None,
        ca: InstallationCA | None = None,
        upstream_tls: ssl.SSLContext | None = None,
    ):
        self.sandbox_id = sandbox_id
        self.socket_path = Path(socket_path)
        self._rules = rules
        self._secrets = secrets
        self._ca = ca
        self._upstream_tls = upstream_tls
        self._services = ServiceSet()
        self.update_services(services or ServiceSet())
        self._resolver = resolver
        self._sink = sink
        self.limits = limits or ProxyLimits()
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._records: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._counters = _Counters()
        self.ledger_failures = 0
        # `default: ask` destinations; a run sets `approvals.approver` to put them to a person.
        self.approvals = EgressApprovals()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        path = self.socket_path
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()  # a stale socket from a previous host process
        self._server = await asyncio.start_unix_server(
            self._serve,
            path=str(path),
            limit=self.limits.max_head_bytes,
            backlog=self.limits.max_connections,
        )
        os.chmod(path, 0o600)

    async def close(self) -> None:
        """Stop listening, cut open connections, wait until every ledger event is recorded."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        await self.approvals.close()
        await self.flush()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def flush(self) -> None:
        """Wait until every event handed to the sink so far is recorded."""
        while self._records:
            await asyncio.gather(*list(self._records), return_exceptions=True)

    async def __aenter__(self) -> EgressProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- rules and counters ----------------------------------------------------------------

    @property
    def rules(self) -> EgressRules:
        return self._rules

    def update_rules(self, rules: EgressRules) -> None:
        """Replace the rule set; every connection or request judged from now on uses it."""
        if not isinstance(rules, EgressRules):
            raise TypeError("update_rules expects an EgressRules")
        self._rules = rules

    @property
    def services(self) -> ServiceSet:
        return self._services

    def update_services(self, services: ServiceSet) -> None:
        """Replace the granted services; every connection or request judged from now on uses
        them (an intercepted tunnel whose service is gone gets 403 on its next request)."""
        if not isinstance(services, ServiceSet):
            raise TypeError("update_services expects a ServiceSet")
        if len(services) and (self._ca is None or self._secrets is None):
            raise ValueError("services need the proxy to have a CA (ca=) and a secret reader")
        self._services = services

    def _service_for(self, host: Host, port: int) -> Service | None:
        return self._services.for_destination(host, port)

    def _upstream_context(self) -> ssl.SSLContext:
        if self._upstream_tls is None:
            self._upstream_tls = upstream_tls_context()
        return self._upstream_tls

    def stats(self) -> EgressStats:
        c = self._counters
        return EgressStats(c.bytes_up, c.bytes_down, c.attempts, c.refused, len(self._connections))

    # -- one client connection -------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        connection = next(self._ids)
        try:
            if len(self._connections) > self.limits.max_connections:
                attempt = _Attempt("overload")
                attempt.decision = Decision(
                    False, "proxy: too many connections", "this sandbox has too many connections"
                )
                attempt.status = 503
                await self._refuse(writer, _Refusal(503, attempt.decision.rule, attempt.reason))
                self._emit(connection, attempt)
                return
            with contextlib.suppress(Exception):
                writer.transport.set_write_buffer_limits(high=4 * self.limits.chunk_bytes)
            sock = writer.get_extra_info("socket")
            if sock is not None and self.limits.guest_send_buffer:
                with contextlib.suppress(OSError):
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.guest_send_buffer
                    )
            await self._serve_requests(reader, writer, connection)
        finally:
            writer.close()
            self._connections.discard(task)

    async def _serve_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: int
    ) -> None:
        """Requests on one client connection until it ends; an intercepted CONNECT switches
        the same loop to the requests inside the guest's TLS (`tunnel`)."""
        upstream: _Upstream | None = None
        tunnel: Intercepted | None = None
        attempt = _Attempt("http")
        try:
            while True:
                attempt = self._new_attempt(tunnel)
                head = await self._read_head(reader)
                if head is None:
                    return
                if head.method == "CONNECT":
                    if tunnel is not None:
                        raise _Refusal(400, "client: malformed", "CONNECT inside a TLS tunnel")
                    attempt = _Attempt("connect")
                    if upstream is not None:
                        await self._close_upstream(upstream)
                        upstream = None
                    tunnel = await self._tunnel(head, reader, writer, attempt)
                    if tunnel is None:
                        return
                    self._emit(connection, attempt)  # the interception itself; calls follow
                    continue
                attempt = self._new_attempt(tunnel)
                upstream, keep_going = await self._forward(
                    head, reader, writer, attempt, upstream, tunnel
                )
                self._emit(connection, attempt)
                if not keep_going:
                    return
        except _Refusal as refusal:
            answered = attempt.status != 0  # a response head already went out
            attempt.host = attempt.host or refusal.host
            attempt.port = attempt.port or refusal.port
            if attempt.allowed and refusal.status in (502, 504):
                # Policy allowed it; the upstream failed. Keep the deciding rule.
                assert attempt.decision is not None
                attempt.decision = Decision(
                    True, attempt.decision.rule, refusal.reason, attempt.decision.exact
                )
            else:
                if attempt.decision is None and attempt.kind != "service":
                    attempt.kind = "malformed"
                attempt.decision = Decision(False, refusal.rule, refusal.reason)
            if not answered:
                attempt.status = refusal.status
                await self._refuse(writer, refusal)
        except _Cut:
            attempt.status = attempt.status or 200
            attempt.cut = True
            attempt.decision = Decision(
                False, MAX_BYTES_RULE, "connection cut: max_bytes_out exceeded"
            )
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client or upstream went away; the attempt (if any) is still recorded
        except asyncio.CancelledError:
            pass  # the proxy is closing; fall through to record what was under way
        except Exception:  # a bug must cost one connection, never the proxy
            log.exception("egress proxy %s: connection %d failed", self.sandbox_id, connection)
        finally:
            if attempt.decision is not None and not attempt.emitted:
                self._emit(connection, attempt)
            if upstream is not None:
                upstream.writer.close()

    @staticmethod
    def _new_attempt(tunnel: Intercepted | None) -> _Attempt:
        if tunnel is None:
            return _Attempt("http")
        attempt = _Attempt("service", service=tunnel.service)
        attempt.host, attempt.port = str(tunnel.host), tunnel.port
        return attempt

    def _emit(self, connection: int, attempt: _Attempt) -> None:
        decision = attempt.decision
        assert decision is not None
        attempt.emitted = True
        cut = attempt.cut
        self._counters.attempts += 1
        if not decision.allowed:
            self._counters.refused += 1
        event = EgressEvent(
            sandbox_id=self.sandbox_id,
            time=attempt.wall,
            connection=connection,
            kind=attempt.kind,
            host=attempt.host,
            port=attempt.port,
            address=attempt.address,
            decision="cut" if cut else ("allowed" if decision.allowed else "refused"),
            rule=decision.rule,
            reason=decision.reason,
            status=attempt.status,
            bytes_up=attempt.bytes_up,
            bytes_down=attempt.bytes_down,
            duration=round(time.monotonic() - attempt.started, 6),
            service=attempt.service,
            secrets=attempt.secrets,
        )
        task = asyncio.get_running_loop().create_task(self._record(event))
        self._records.add(task)
        task.add_done_callback(self._records.discard)

    async def _record(self, event: EgressEvent) -> None:
        try:
            await self._sink.record(event)
        except Exception:
            self.ledger_failures += 1
            log.exception("egress proxy %s: ledger sink failed", self.sandbox_id)

    async def _refuse(self, writer: asyncio.StreamWriter, refusal: _Refusal) -> None:
        rule = _clean(refusal.rule)
        body = f"aamp egress refused: {_clean(refusal.reason, 400)}\nrule: {rule}\n".encode()
        head = (
            f"HTTP/1.1 {refusal.status} {_REASONS.get(refusal.status, 'Error')}\r\n"
            f"X-Aamp-Egress-Rule: {rule}\r\n"
            "Content-Type: text/plain; charset=us-ascii\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode("ascii")
        with contextlib.suppress(ConnectionError, RuntimeError):
            writer.write(head + body)
            await writer.drain()

    # -- parsing ---------------------------------------------------------------------------

    async def _read_head(self, reader: asyncio.StreamReader) -> _Head | None:
        """The next request head; None when the client closed or stayed idle (no event)."""
        limits = self.limits
        try:
            async with asyncio.timeout(limits.idle_timeout):
                start = await reader.read(1)
        except TimeoutError:
            return None
        if not start:
            return None
        try:
            async with asyncio.timeout(limits.header_timeout):
                rest = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            raise _Refusal(
                408, "client: header timeout", "the request head did not arrive in time"
            ) from None
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("client closed mid-head") from None
        except asyncio.LimitOverrunError:
            buffered = start + await reader.read(limits.max_head_bytes)
            if b"\r\n" not in buffered[: limits.max_request_line + 2]:
                raise _Refusal(
                    414, "client: request line too long", "the request line is too long"
                ) from None
            raise _Refusal(
                431, "client: header too large", "the request header block is too large"
            ) from None
        data = start + rest
        if len(data) > limits.max_head_bytes:
            raise _Refusal(431, "client: header too large", "the request header block is too large")
        return self._parse_head(data[:-4])

    def _parse_head(self, data: bytes) -> _Head:
        lines = data.split(b"\r\n")
        request_line = lines[0]
        if len(request_line) > self.limits.max_request_line:
            raise _Refusal(414, "client: request line too long", "the request line is too long")
        if len(lines) - 1 > self.limits.max_headers:
            raise _Refusal(431, "client: too many headers", "too many header fields")
        for line in lines:
            if b"\r" in line or b"\n" in line or b"\x00" in line:
                raise _Refusal(400, "client: malformed", "bare CR, LF or NUL in the request head")
        parts = request_line.split(b" ")
        if len(parts) != 3:
            raise _Refusal(
                400, "client: malformed", "the request line is not METHOD TARGET VERSION"
            )
        method, target, version = parts
        if not _TOKEN_RE.match(method) or not _TARGET_RE.match(target):
            raise _Refusal(400, "client: malformed", "bad characters in the request line")
        if version not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise _Refusal(400, "client: malformed", "only HTTP/1.1 and HTTP/1.0 are spoken")
        headers: list[tuple[str, str]] = []
        raw_names: list[str] = []
        for line in lines[1:]:
            if line[:1] in (b" ", b"\t"):
                raise _Refusal(400, "client: malformed", "obsolete header folding is refused")
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN_RE.match(name) or not _FIELD_VALUE_RE.match(value):
                raise _Refusal(400, "client: malformed", "a header line is malformed")
            raw_names.append(name.decode("ascii"))
            headers.append((name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1")))
        head = _Head(method.decode(), target.decode(), version.decode(), headers, raw_names)
        if len(head.get_all("host")) > 1:
            raise _Refusal(400, "client: duplicate host", "more than one Host header")
        return head

    @staticmethod
    def _authority(text: str, default_port: int | None) -> tuple[Host, int]:
        try:
            host_text, port_text = split_host_port(text)
            if port_text is None:
                if default_port is None:
                    raise HostError(f"{text!r} has no port")
                port = default_port
            else:
                port = parse_port(port_text)
            return normalize_host(host_text), port
        except HostError as exc:
            raise _Refusal(400, "client: bad target", str(exc), host=_clean(text, 100)) from None

    def _check_host_header(self, head: _Head, host: Host, port: int, default_port: int) -> None:
        value = head.get("host")
        if value is None:
            if head.version == "HTTP/1.1" and head.method != "CONNECT":
                raise _Refusal(400, "client: missing host", "HTTP/1.1 requires a Host header")
            return
        other_host, other_port = self._authority(value, default_port)
        if (other_host, other_port) != (host, port):
            raise _Refusal(
                400,
                "client: host mismatch",
                f"the Host header ({_clean(value, 100)}) names another place than the target",
                host=str(host),
                port=port,
            )

    # -- deciding and connecting -----------------------------------------------------------

    async def _judge(self, host: Host, port: int, attempt: _Attempt) -> Decision:
        attempt.host, attempt.port = str(host), port
        cap = self._rules.max_bytes_out
        if cap is not None and self._counters.bytes_up >= cap:
            attempt.decision = Decision(
                False, MAX_BYTES_RULE, f"this sandbox has sent its {cap} bytes allowed"
            )
        else:
            attempt.decision = await self.approvals.judge(
                self._rules.decide(host, port), host, port
            )
        if not attempt.decision.allowed:
            raise _Refusal(403, attempt.decision.rule, attempt.decision.reason)
        return attempt.decision

    async def _addresses(self, host: Host, decision: Decision, attempt: _Attempt) -> list:
        """Resolve once; keep the addresses `check_address` passes, in resolver order."""
        if host.ip is not None:
            found: list[IPAddress] = [host.ip]
        else:
            try:
                found = await self._resolver.resolve(host.name)
            except ResolveError as exc:
                status = 504 if exc.timeout else 502
                attempt.decision = Decision(False, "resolve", str(exc))
                raise _Refusal(status, "resolve", str(exc)) from None
        rules = self._rules
        passed: list[IPAddress] = []
        first_refusal: Decision | None = None
        for address in found:
            verdict = rules.check_address(decision, str(host), address)
            if verdict.allowed:
                passed.append(address)
            elif first_refusal is None:
                first_refusal = verdict
                attempt.address = str(address)
        if not passed:
            assert first_refusal is not None
            attempt.decision = first_refusal
            raise _Refusal(403, first_refusal.rule, first_refusal.reason)
        return passed

    async def _open_upstream(
        self, host: Host, port: int, addresses: list, attempt: _Attempt, *, tls: bool = False
    ):
        """Connect to the first checked address that answers. No name lookup happens here.

        With `tls`, speak TLS to it, verifying its certificate for `host` (service upstreams)."""
        loop = asyncio.get_running_loop()
        last_error = "no address"
        for address in addresses:
            attempt.address = str(address)
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                async with asyncio.timeout(self.limits.connect_timeout):
                    await loop.sock_connect(sock, (str(address), port))
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    if tls:
                        reader, writer = await asyncio.open_connection(
                            sock=sock,
                            limit=4 * self.limits.chunk_bytes,
                            ssl=self._upstream_context(),
                            server_hostname=tls_server_name(host),
                            ssl_handshake_timeout=self.limits.connect_timeout,
                        )
                    else:
                        reader, writer = await asyncio.open_connection(
                            sock=sock, limit=4 * self.limits.chunk_bytes
                        )
            except TimeoutError:
                sock.close()
                last_error = f"connecting to {address} port {port} timed out"
                continue
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                last_error = (
                    f"the certificate of {address} port {port} is not trusted for {host}: "
                    f"{exc.verify_message}"
                )
                continue
            except ssl.SSLError as exc:
                sock.close()
                last_error = f"TLS with {address} port {port} failed: {exc.reason or exc}"
                continue
            except OSError as exc:
                sock.close()
                last_error = f"cannot connect to {address} port {port}: {exc.strerror or exc}"
                continue
            with contextlib.suppress(Exception):
                writer.transport.set_write_buffer_limits(high=4 * self.limits.chunk_bytes)
            return _Upstream(host, port, address, reader, writer, tls)
        status = 504 if "timed out" in last_error else 502
        rule = attempt.decision.rule if attempt.decision else "upstream"
        raise _Refusal(status, rule, last_error)

    @staticmethod
    async def _close_upstream(upstream: _Upstream) -> None:
        upstream.writer.close()
        with contextlib.suppress(Exception):
            await upstream.writer.wait_closed()

    # -- CONNECT ---------------------------------------------------------------------------

    async def _tunnel(
        self,
        head: _Head,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        attempt: _Attempt,
    ) -> Intercepted | None:
        """Serve a CONNECT. A plain tunnel is relayed here until it ends (returns None); a
        service host's tunnel is intercepted and returned for the request loop to serve."""
        host, port = self._authority(head.target, None)
        attempt.host, attempt.port = str(host), port
        self._check_host_header(head, host, port, port)
        decision = await self._judge(host, port, attempt)
        addresses = await self._addresses(host, decision, attempt)
        service = self._service_for(host, port)
        if service is not None:
            return await self._intercept(host, port, service, reader, writer, attempt)
        upstream = await self._open_upstream(host, port, addresses, attempt)
        try:
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            attempt.status = 200
            await self._relay(reader, writer, upstream, attempt)
        finally:
            await self._close_upstream(upstream)
        return None

    async def _intercept(
        self,
        host: Host,
        port: int,
        service: Service,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        attempt: _Attempt,
    ) -> Intercepted:
        """Become the TLS server for `host` towards the guest (leaf from the installation CA).

        The upstream connection is opened by the first request, like plain HTTP's."""
        assert self._ca is not None
        attempt.service = service.name
        if getattr(reader, "_buffer", b""):
            # Bytes sent before our 200 would be lost to the TLS layer: refuse, do not guess.
            raise _Refusal(400, "client: malformed", "data sent before the tunnel was established")
        context = self._ca.server_context(tls_server_name(host))
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        attempt.status = 200
        try:
            await writer.start_tls(context, ssl_handshake_timeout=self.limits.header_timeout)
        except (ssl.SSLError, ConnectionError, TimeoutError, asyncio.IncompleteReadError) as exc:
            attempt.decision = Decision(
                False, HANDSHAKE_RULE, f"the guest's TLS handshake failed ({type(exc).__name__})"
            )
            raise ConnectionResetError("client TLS handshake failed") from None
        return intercepted(host, port, service.name, writer.get_extra_info("ssl_object"))

    async def _relay(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        upstream: _Upstream,
        attempt: _Attempt,
    ) -> None:
        """Copy both ways until both sides are done; half-closes are passed on.

        On Linux the tunnel's sockets are taken out of their asyncio transports and bytes move
        with splice(2) through a pipe, never entering Python: that is what makes a tunnel
        nearly as fast as a direct connection. Elsewhere (or if the streams cannot be detached)
        the stream pumps below do the same job with copies."""
        client = splice.detach(client_r, client_w) if splice.available() else None
        remote = splice.detach(upstream.reader, upstream.writer) if client else None
        if client is not None and remote is not None:
            await self._splice_relay(client, remote, attempt)
            return
        if client is not None:  # pragma: no cover - detaching the second side failed
            client[0].close()
            raise ConnectionResetError("could not take over the tunnel")
        up = asyncio.ensure_future(self._pump_up(client_r, upstream.writer, attempt))
        down = asyncio.ensure_future(self._pump_down(upstream.reader, client_w, attempt))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _splice_relay(
        self,
        client: tuple[socket.socket, bytes],
        remote: tuple[socket.socket, bytes],
        attempt: _Attempt,
    ) -> None:
        client_sock, client_left = client
        remote_sock, remote_left = remote
        loop = asyncio.get_running_loop()
        try:
            if client_left:
                room = self._room_up(len(client_left))
                await loop.sock_sendall(remote_sock, client_left[:room])
                self._count(attempt, room, up=True)
                if room < len(client_left):
                    raise _Cut()
            if remote_left:
                await loop.sock_sendall(client_sock, remote_left)
                self._count(attempt, len(remote_left), up=False)
            up = asyncio.ensure_future(self._splice(client_sock, remote_sock, attempt, up=True))
            down = asyncio.ensure_future(self._splice(remote_sock, client_sock, attempt, up=False))
            try:
                done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    if task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            finally:
                for task in (up, down):
                    task.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        finally:
            client_sock.close()
            remote_sock.close()

    def _room_up(self, wanted: int) -> int:
        cap = self._rules.max_bytes_out
        if cap is None:
            return wanted
        return max(0, min(wanted, cap - self._counters.bytes_up))

    def _count(self, attempt: _Attempt, n: int, *, up: bool) -> None:
        if up:
            attempt.bytes_up += n
            self._counters.bytes_up += n
        else:
            attempt.bytes_down += n
            self._counters.bytes_down += n

    async def _splice(
        self, src: socket.socket, dst: socket.socket, attempt: _Attempt, *, up: bool
    ) -> None:
        """Move bytes src → dst with splice(2) until src ends, then pass the half-close on."""
        await splice.move(
            src.fileno(),
            dst.fileno(),
            length=None,
            room=self._room_up if up else _all,
            count=lambda n: self._count(attempt, n, up=up),
        )
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    async def _pump_up(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, attempt: _Attempt
    ) -> None:
        await self._pump(source, sink, lambda data: self._send_up(sink, data, attempt))

    async def _pump_down(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, attempt: _Attempt
    ) -> None:
        def forward(data: bytes) -> None:
            sink.write(data)
            attempt.bytes_down += len(data)
            self._counters.bytes_down += len(data)

        await self._pump(source, sink, forward)

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        forward: Callable[[bytes], None],
    ) -> None:
        """Copy until EOF (passed on as a half-close), counting through `forward`."""
        size = self.limits.chunk_bytes
        while True:
            data = await source.read(size)
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    if sink.can_write_eof():
                        sink.write_eof()
                return
            forward(data)
            await sink.drain()

    def _send_up(self, sink: asyncio.StreamWriter, data: bytes, attempt: _Attempt) -> None:
        """Write guest bytes upstream, enforcing the per-sandbox `max_bytes_out` cap."""
        cap = self._rules.max_bytes_out
        if cap is not None and self._counters.bytes_up + len(data) > cap:
            room = max(0, cap - self._counters.bytes_up)
            if room:
                sink.write(data[:room])
                attempt.bytes_up += room
                self._counters.bytes_up += room
            raise _Cut()
        sink.write(data)
        attempt.bytes_up += len(data)
        self._counters.bytes_up += len(data)

    # -- plain HTTP ------------------------------------------------------------------------

    def _absolute_target(self, target: str) -> tuple[Host, int, str, str]:
        """(host, port, authority text, origin-form path) from `http://authority/path?q`."""
        if not target.lower().startswith("http://"):
            if target.lower().startswith("https://"):
                raise _Refusal(400, "client: bad target", "https:// needs CONNECT")
            raise _Refusal(
                400, "client: bad target", "a proxy request needs an absolute http:// URI"
            )
        rest = target[7:]
        if "#" in rest:
            raise _Refusal(400, "client: bad target", "a fragment is not sent in a request")
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        authority, path = rest[:cut], rest[cut:]
        if "@" in authority:
            raise _Refusal(400, "client: bad target", "userinfo in the URI is refused")
        if path.startswith("?") or path == "":
            path = "/" + path
        host, port = self._authority(authority, 80)
        return host, port, authority, path

    async def _forward(
        self,
        head: _Head,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        attempt: _Attempt,
        upstream: _Upstream | None,
        tunnel: Intercepted | None = None,
    ) -> tuple[_Upstream | None, bool]:
        if tunnel is None:
            host, port, authority, path = self._absolute_target(head.target)
            attempt.host, attempt.port = str(host), port
            self._check_host_header(head, host, port, 80)
        else:
            host, port, authority, path = self._tunnel_target(head, tunnel)
        framing = self._request_framing(head)
        expect = head.get("expect")
        if expect is not None and expect.lower() != "100-continue":
            raise _Refusal(417, "client: expectation", "only Expect: 100-continue is supported")
        decision = await self._judge(host, port, attempt)
        service = self._service_for(host, port)
        if tunnel is not None and (service is None or service.name != tunnel.service):
            raise _Refusal(
                403,
                NOT_GRANTED_RULE,
                f"service {tunnel.service} is no longer granted to this sandbox",
            )
        credential: Credential | None = None
        if service is not None:
            attempt.service = service.name
            attempt.secrets = service.secret_names
            credential = await self._credential(service, head, host)
        tls = service is not None and service.tls
        if upstream is not None:
            same = upstream.host == host and upstream.port == port and upstream.tls == tls
            # Reuse a kept-alive upstream only for the same place, if the (possibly changed)
            # rules still pass its address, and if the upstream has not closed it meanwhile.
            stale = upstream.reader.at_eof() or upstream.writer.is_closing()
            if (
                not same
                or stale
                or not self._rules.check_address(decision, str(host), upstream.address).allowed
            ):
                await self._close_upstream(upstream)
                upstream = None
        if upstream is None:
            addresses = await self._addresses(host, decision, attempt)
            upstream = await self._open_upstream(host, port, addresses, attempt, tls=tls)
        attempt.address = str(upstream.address)
        try:
            keep = await self._exchange(
                head, path, authority, framing, reader, writer, upstream, attempt, credential
            )
        except BaseException:
            await self._close_upstream(upstream)
            raise
        client_keep, upstream_keep = keep
        if not upstream_keep:
            await self._close_upstream(upstream)
            upstream = None
        return upstream, client_keep

    def _tunnel_target(self, head: _Head, tunnel: Intercepted) -> tuple[Host, int, str, str]:
        """(host, port, authority, path) of a request inside an intercepted tunnel: the TLS
        server name and the Host header must both name the tunnel's host (no fronting)."""
        problem = tunnel.sni_problem()
        if problem is not None:
            raise _Refusal(421, problem[0], problem[1], host=str(tunnel.host), port=tunnel.port)
        target = head.target
        if target.lower().startswith("https://"):
            rest = target[8:]
            cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
            authority, path = rest[:cut], rest[cut:] or "/"
            if "@" in authority:
                raise _Refusal(400, "client: bad target", "userinfo in the URI is refused")
            if path.startswith("?"):
                path = "/" + path
            if self._authority(authority, 443) != (tunnel.host, tunnel.port):
                raise _Refusal(
                    421,
                    HOST_MISMATCH_RULE,
                    f"the request names {_clean(authority, 100)}, the tunnel is for "
                    f"{tunnel.host}:{tunnel.port}",
                )
        elif target.startswith("/"):
            path = target
        else:
            raise _Refusal(400, "client: bad target", "a request in a tunnel needs a /path target")
        if "#" in path:
            raise _Refusal(400, "client: bad target", "a fragment is not sent in a request")
        value = head.get("host")
        if value is None:
            raise _Refusal(400, "client: missing host", "a request in a tunnel needs a Host header")
        if self._authority(value, 443) != (tunnel.host, tunnel.port):
            raise _Refusal(
                421,
                HOST_MISMATCH_RULE,
                f"the Host header ({_clean(value, 100)}) is not the host of the TLS connection "
                f"({tunnel.host}:{tunnel.port})",
            )
        return tunnel.host, tunnel.port, value, path

    async def _credential(self, service: Service, head: _Head, host: Host) -> Credential:
        if self._secrets is None:  # pragma: no cover - update_services refuses this
            raise _Refusal(503, CREDENTIAL_RULE, "this proxy has no secret reader")
        purpose = f"egress {self.sandbox_id}: service {service.name} ({head.method} {host})"
        try:
            return await render(service, self._secrets, purpose)
        except CredentialError as exc:
            raise _Refusal(503, CREDENTIAL_RULE, str(exc)) from None

    @staticmethod
    def _request_framing(head: _Head) -> tuple[str, int]:
        te = head.get_all("transfer-encoding")
        cl = head.get_all("content-length")
        if te and cl:
            raise _Refusal(400, "client: malformed", "both Transfer-Encoding and Content-Length")
        if te:
            if len(te) != 1 or te[0].strip().lower() != "chunked":
                raise _Refusal(501, "client: malformed", "only Transfer-Encoding: chunked")
            return "chunked", 0
        if cl:
            values = {v.strip() for v in cl}
            if len(values) != 1 or not next(iter(values)).isdigit():
                raise _Refusal(400, "client: malformed", "bad Content-Length")
            return "length", int(next(iter(values)))
        return "none", 0

    async def _exchange(
        self,
        head: _Head,
        path: str,
        authority: str,
        framing: tuple[str, int],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: _Upstream,
        attempt: _Attempt,
        credential: Credential | None = None,
    ) -> tuple[bool, bool]:
        """Send one request upstream and its response back. Returns (client keep-alive,
        upstream reusable). With a `credential` (a service call) its headers replace the
        guest's of the same name and the response is scrubbed of its secret values."""
        tokens = head.connection_tokens()
        drop = _HOP_BY_HOP | tokens
        if credential is not None:
            drop = drop | credential.replaces | {"accept-encoding"}
        lines = [f"{head.method} {path} HTTP/1.1"]
        if head.get("host") is None:
            lines.append(f"Host: {authority}")
        for (name, value), raw in zip(head.headers, head.raw_names, strict=True):
            if name not in drop:
                lines.append(f"{raw}: {value}")
        if credential is not None:
            lines.append("Accept-Encoding: identity")  # spares decoding it to scrub it
            lines.extend(f"{name}: {value}" for name, value in credential.headers)
        kind, length = framing
        if kind == "chunked":
            lines.append("Transfer-Encoding: chunked")
        out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        del lines
        if head.get("expect") is not None:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._send_up(upstream.writer, out, attempt)
        del out
        if kind == "length":
            await self._copy_length(
                reader, upstream.writer, length, attempt, up=True, source_writer=writer
            )
        elif kind == "chunked":
            await self._copy_chunked(
                reader, upstream.writer, attempt, up=True, source_writer=writer
            )
        await upstream.writer.drain()

        scrubber = Scrubber(credential.scrub_forms) if credential is not None else None
        client_keep = (
            "close" not in tokens if head.version == "HTTP/1.1" else "keep-alive" in tokens
        )
        while True:
            status, response = await self._read_response_head(upstream.reader)
            if status == 101:
                raise _Refusal(502, attempt.decision.rule, "unexpected 101 from upstream")
            if 100 <= status < 200:
                raw = response.raw if scrubber is None else scrubber.scrub(response.raw)
                self._send_down(writer, raw, attempt)
                continue
            break
        attempt.status = status
        rtokens = response.connection_tokens()
        upstream_keep = response.version == "HTTP/1.1" and "close" not in rtokens
        rdrop = _HOP_BY_HOP | rtokens
        te = response.get_all("transfer-encoding")
        cl = response.get_all("content-length")
        if head.method == "HEAD" or status in (204, 304):
            body = ("none", 0)
        elif te:
            if te[-1].strip().lower().split(",")[-1].strip() != "chunked":
                body = ("eof", 0)
            else:
                body = ("chunked", 0)
        elif cl:
            values = {v.strip() for v in cl}
            if len(values) != 1 or not next(iter(values)).isdigit():
                raise _Refusal(502, attempt.decision.rule, "upstream sent a bad Content-Length")
            body = ("length", int(next(iter(values))))
        else:
            body = ("eof", 0)
        if body[0] == "eof":
            client_keep = False
            upstream_keep = False
        # How the body goes to the guest: as it came, or (scrubbed) re-framed.
        down = body[0]
        decoder: BodyDecoder | None = None
        status_line = response.status_line
        if scrubber is not None:
            status_line = scrubber.scrub(status_line.encode("latin-1")).decode("latin-1")
            if body[0] != "none":
                encodings = response.get_all("content-encoding")
                try:
                    decoder = BodyDecoder(", ".join(encodings))
                except UnsupportedEncoding as exc:
                    raise _Refusal(502, attempt.decision.rule, str(exc)) from None
                rdrop = rdrop | {"content-length"} | _BODY_DIGESTS
                if decoder.decoding:
                    rdrop = rdrop | {"content-encoding"}
                down = "chunked" if head.version == "HTTP/1.1" else "eof"
                if down == "eof":
                    client_keep = False
        out_lines = [status_line]
        for (name, value), raw in zip(response.headers, response.raw_names, strict=True):
            if name not in rdrop:
                if scrubber is not None:
                    raw = scrubber.scrub(raw.encode("latin-1")).decode("latin-1")
                    value = scrubber.scrub(value.encode("latin-1")).decode("latin-1")
                out_lines.append(f"{raw}: {value}")
        if down == "chunked":
            out_lines.append("Transfer-Encoding: chunked")
        if not client_keep:
            out_lines.append("Connection: close")
        elif head.version == "HTTP/1.0":
            out_lines.append("Connection: keep-alive")
        self._send_down(writer, ("\r\n".join(out_lines) + "\r\n\r\n").encode("latin-1"), attempt)
        if decoder is not None:
            assert scrubber is not None
            await self._scrub_body(upstream.reader, writer, body, down, decoder, scrubber, attempt)
        elif body[0] == "length":
            await self._copy_length(
                upstream.reader, writer, body[1], attempt, up=False, source_writer=upstream.writer
            )
        elif body[0] == "chunked":
            await self._copy_chunked(
                upstream.reader, writer, attempt, up=False, source_writer=upstream.writer
            )
        elif body[0] == "eof":
            if await self._splice_body(
                upstream.reader, upstream.writer, writer, None, attempt, up=False
            ):
                with contextlib.suppress(OSError, RuntimeError):
                    if writer.can_write_eof():
                        writer.write_eof()
            else:
                await self._pump_down(upstream.reader, writer, attempt)
        await writer.drain()
        return client_keep, upstream_keep

    async def _scrub_body(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        body: tuple[str, int],
        down: str,
        decoder: BodyDecoder,
        scrubber: Scrubber,
        attempt: _Attempt,
    ) -> None:
        """Decode the upstream body's framing and coding, scrub it, send it `down`
        (chunked, or until close for an HTTP/1.0 guest)."""
        chunked = down == "chunked"

        def send(pieces: tuple[bytes | memoryview, ...] | list[bytes | memoryview]) -> None:
            # One writelines per piece of body: over TLS that is one encryption pass and one
            # socket write for the chunk header, the data and the CRLF together.
            size = sum(len(p) for p in pieces)
            if not size:
                return
            if chunked:
                pieces = [b"%x\r\n" % size, *pieces, b"\r\n"]
            sink.writelines(pieces)
            n = sum(len(p) for p in pieces)
            attempt.bytes_down += n
            self._counters.bytes_down += n

        try:
            async for piece in self._body_pieces(source, body):
                for decoded in decoder.feed(piece):
                    send(scrubber.feed_pieces(decoded))
                    await sink.drain()
            send((scrubber.feed(decoder.flush()),))
        except UnsupportedEncoding as exc:
            raise _Refusal(502, attempt.decision.rule, str(exc)) from None
        send((scrubber.flush(),))
        if chunked:
            self._send_down(sink, b"0\r\n\r\n", attempt)

    async def _body_pieces(self, source: asyncio.StreamReader, body: tuple[str, int]):
        """The upstream body's bytes, framing removed (trailers are dropped). Read in pieces
        of up to the upstream reader's buffer limit: fewer, larger pieces cost less per byte."""
        kind, length = body
        size = 4 * self.limits.chunk_bytes  # the upstream reader's limit (see _open_upstream)
        if kind == "length":
            remaining = length
            while remaining:
                data = await source.read(min(size, remaining))
                if not data:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(data)
                yield data
        elif kind == "eof":
            while data := await source.read(size):
                yield data
        elif kind == "chunked":
            while True:
                line = await source.readuntil(b"\r\n")
                size_text = line[:-2].split(b";", 1)[0].strip()
                if not re.fullmatch(rb"[0-9a-fA-F]{1,16}", size_text):
                    raise _Refusal(502, "upstream: malformed", "bad chunk size from upstream")
                remaining = int(size_text, 16)
                if remaining == 0:
                    while await source.readuntil(b"\r\n") != b"\r\n":
                        pass
                    return
                while remaining:
                    data = await source.read(min(size, remaining))
                    if not data:
                        raise asyncio.IncompleteReadError(b"", remaining)
                    remaining -= len(data)
                    yield data
                if await source.readexactly(2) != b"\r\n":
                    raise _Refusal(502, "upstream: malformed", "chunk not followed by CRLF")

    def _send_down(
        self, writer: asyncio.StreamWriter, data: bytes | memoryview, attempt: _Attempt
    ) -> None:
        writer.write(data)
        attempt.bytes_down += len(data)
        self._counters.bytes_down += len(data)

    async def _read_response_head(self, reader: asyncio.StreamReader):
        try:
            async with asyncio.timeout(self.limits.response_timeout):
                data = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            raise _Refusal(
                504, "upstream: timeout", "the upstream did not answer in time"
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError):
            raise _Refusal(
                502, "upstream: closed", "the upstream closed without a response"
            ) from None
        except asyncio.LimitOverrunError:
            raise _Refusal(
                502, "upstream: malformed", "the upstream response head is too large"
            ) from None
        if len(data) > 4 * self.limits.max_head_bytes:
            raise _Refusal(502, "upstream: malformed", "the upstream response head is too large")
        lines = data[:-4].split(b"\r\n")
        if not _STATUS_LINE_RE.match(lines[0]) or any(
            b"\r" in line or b"\n" in line or b"\x00" in line for line in lines
        ):
            raise _Refusal(502, "upstream: malformed", "the upstream sent a malformed response")
        headers: list[tuple[str, str]] = []
        raw_names: list[str] = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN_RE.match(name) or line[:1] in (b" ", b"\t"):
                raise _Refusal(502, "upstream: malformed", "the upstream sent a malformed header")
            raw_names.append(name.decode("ascii"))
            headers.append((name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1")))
        status_line = lines[0].decode("latin-1")
        response = _Response(status_line, status_line[:8], headers, raw_names, data)
        return int(status_line[9:12]), response

    async def _copy_length(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        length: int,
        attempt: _Attempt,
        *,
        up: bool,
        source_writer: asyncio.StreamWriter | None = None,
    ) -> None:
        """Forward exactly `length` body bytes. With the source's writer (its transport) given
        and both ends plain sockets, a large body is spliced (`_splice_body`)."""
        if (
            source_writer is not None
            and length >= splice.MIN_BODY
            and await self._splice_body(source, source_writer, sink, length, attempt, up=up)
        ):
            return
        remaining = length
        size = self.limits.chunk_bytes
        while remaining:
            data = await source.read(min(size, remaining))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            if up:
                self._send_up(sink, data, attempt)
            else:
                self._send_down(sink, data, attempt)
            await sink.drain()

    async def _splice_body(
        self,
        source: asyncio.StreamReader,
        source_writer: asyncio.StreamWriter,
        sink: asyncio.StreamWriter,
        length: int | None,
        attempt: _Attempt,
        *,
        up: bool,
    ) -> bool:
        """Forward a body of `length` bytes (None: until the source ends) with splice(2), the
        request/response heads around it staying with the streams and the parser. False
        (nothing moved) if either end is not a plain socket or the body is already buffered.

        What the source's reader had buffered goes first, through the same accounting as the
        copy path; the sink's buffer is emptied before the first spliced byte."""
        if not splice.available():
            return False
        src = splice.plain_socket(source_writer)
        dst = splice.plain_socket(sink)
        ahead = splice.read_ahead(source)
        if src is None or dst is None or ahead is None:
            return False
        if length is not None and length - len(ahead) < splice.MIN_BODY:
            return False  # (nearly) all buffered already: a copy is cheaper
        with splice.reading_paused(source, source_writer.transport):
            if ahead:
                data = bytes(ahead)
                ahead.clear()
                (self._send_up if up else self._send_down)(sink, data, attempt)
                if length is not None:
                    length -= len(data)
            await splice.flushed(sink)
            with splice.owned_fd(src) as src_fd, splice.owned_fd(dst) as dst_fd:
                await splice.move(
                    src_fd,
                    dst_fd,
                    length=length,
                    room=self._room_up if up else _all,
                    count=lambda n: self._count(attempt, n, up=up),
                )
        return True

    async def _copy_chunked(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        attempt: _Attempt,
        *,
        up: bool,
        source_writer: asyncio.StreamWriter | None = None,
    ) -> None:
        """Forward a chunked body verbatim while parsing it, so its end is known (each chunk's
        size line is parsed here; a large chunk's data may be spliced)."""
        send = self._send_up if up else self._send_down
        while True:
            line = await source.readuntil(b"\r\n")
            size_text = line[:-2].split(b";", 1)[0].strip()
            if not size_text or not re.fullmatch(rb"[0-9a-fA-F]{1,16}", size_text):
                if up:
                    raise _Refusal(400, "client: malformed", "bad chunk size")
                raise _Refusal(502, "upstream: malformed", "bad chunk size from upstream")
            size = int(size_text, 16)
            send(sink, line, attempt)
            if size == 0:
                while True:  # trailers, then the final CRLF
                    trailer = await source.readuntil(b"\r\n")
                    send(sink, trailer, attempt)
                    if trailer == b"\r\n":
                        await sink.drain()
                        return
            await self._copy_length(source, sink, size, attempt, up=up, source_writer=source_writer)
            crlf = await source.readexactly(2)
            if crlf != b"\r\n":
                raise _Refusal(
                    400 if up else 502,
                    "client: malformed" if up else "upstream: malformed",
                    "chunk not followed by CRLF",
                )
            send(sink, crlf, attempt)


@dataclass
class _Response:
    status_line: str
    version: str
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
