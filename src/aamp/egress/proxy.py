"""The egress proxy: the only way out of a sandbox, one listener per sandbox on a Unix socket.

The sandbox's channel (a Unix socket bound into a gVisor sandbox, or a vsock port forwarded
by Firecracker) carries the guest's bytes to `socket_path`; there is no TCP port a guest could
reach. This module is the listener and the ledger: it accepts connections, reads each request
head (`http1.py`), hands it to the job that serves it — `CONNECT` to `tunnel.py` (a byte
tunnel, or TLS interception for a granted service's origin), anything else to `forward.py`
(plain HTTP and service calls, kept alive, every request judged again) — and writes exactly
one `EgressEvent` per attempt to the sink. Every way out asks the one decision first
(`decision.py`: rules, granted services, `ask`, host-side resolution, address classes, and the
installation's own listeners, which no rule opens) and connects only to an address it checked.

The ledger: one event per request or tunnel, allowed or refused, with the rule that decided and
the bytes each way (`meter.py` counts them as they leave). A connection that ends before any
request — closed at once, idle, or after a partial head (a bare CRLF included) — leaves one
event too (kind `idle`, or `malformed` for a partial head), so every connection is accounted
for. A refusal is an HTTP response: 403 for policy (body and `X-Aamp-Egress-Rule` name the
rule), 400 for a malformed request, 408 for a client too slow to send its head, 414/431 for an
over-long request line / header block, 502 for upstream failures, 504 for upstream timeouts.
After a refusal the proxy half-closes and drains what the client still sends (bounded), so the
client reads the refusal instead of a connection reset.

`max_bytes_out` is a per-sandbox cap on bytes sent upstream across all connections. The
connection that crosses it is cut, and later attempts are refused with rule
`egress.max_bytes_out`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aamp.egress.approvals import EgressApprovals
from aamp.egress.bodies import Bodies
from aamp.egress.ca import InstallationCA, LeafSource
from aamp.egress.decision import MAX_BYTES_RULE, Decider
from aamp.egress.forward import Forwarding
from aamp.egress.held_credentials import HeldCredentials
from aamp.egress.http1 import NoRequest, Refusal, read_request_head, refusal_response
from aamp.egress.installation import InstallationListeners
from aamp.egress.intercept import Intercepted
from aamp.egress.ledger import EgressEvent, EgressSink
from aamp.egress.limits import ProxyLimits
from aamp.egress.meter import Attempt, CapReached, Meter
from aamp.egress.resolver import Resolver
from aamp.egress.rules import Decision, EgressRules
from aamp.egress.services import SecretReader, ServiceSet
from aamp.egress.tunnel import Tunnels
from aamp.egress.upstream import Connector, Upstream
from aamp.unix_socket import listen_private, stop_listening

__all__ = ["MAX_BYTES_RULE", "EgressContext", "EgressProxy", "EgressStats", "ProxyLimits"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EgressStats:
    """A snapshot of one sandbox's egress: bytes sent up (guest → world) and down."""

    bytes_up: int
    bytes_down: int
    attempts: int
    refused: int
    open_connections: int


@dataclass
class EgressContext:
    """What every sandbox's proxy on one host shares (the sandbox manager holds it): how names
    resolve, where the ledger goes, credential injection (`secrets`, or `secrets_for` each
    sandbox, and `ca`), how service upstreams are verified, and the installation's own
    listeners, which no sandbox reaches."""

    resolver: Resolver
    sink: EgressSink
    secrets: SecretReader | None = None
    # Or each sandbox's own reader (a host on another machine asks the control plane for one
    # sandbox's credentials: `aamp.fleet.host_outbox.LinkSecrets`).
    secrets_for: Callable[[str], SecretReader] | None = None
    ca: InstallationCA | None = None
    # Or each sandbox's own leaf source (a host on another machine has no CA key: a replica
    # signs its leaves, `aamp.fleet.host_outbox.LinkLeaves`).
    leaves_for: Callable[[str], LeafSource] | None = None
    upstream_tls: ssl.SSLContext | None = None
    listeners: InstallationListeners | None = None

    def proxy(self, sandbox_id: str, socket_path: Path, rules: EgressRules) -> EgressProxy:
        """A proxy for one sandbox, not yet started."""
        return EgressProxy(sandbox_id, socket_path, rules, self)

    def secrets_of(self, sandbox_id: str) -> SecretReader | None:
        """The reader of `sandbox_id`'s credentials: its own, or the one every proxy shares."""
        return self.secrets_for(sandbox_id) if self.secrets_for else self.secrets

    def leaves_of(self, sandbox_id: str) -> LeafSource | None:
        """Where `sandbox_id`'s proxy gets its leaves: its own source, or the CA."""
        return self.leaves_for(sandbox_id) if self.leaves_for else self.ca


class EgressProxy:
    """One sandbox's egress proxy. Usage::

    context = EgressContext(StaticResolver({...}), sink)   # shared by a host's proxies
    proxy = EgressProxy("sb-0123456789ab", sock_path, rules, context)
    await proxy.start()
    ...                                # the guest's forwarder dials sock_path
    proxy.update_rules(new_rules)      # applies to the next connection / request
    proxy.update_services(services)    # the same, for the granted services
    await proxy.close()                # stops, cuts connections, waits for the ledger

    Credential injection needs `services` (a `ServiceSet`) and, in the context, `secrets` (a
    `SecretReader`, e.g. `VaultSecretReader(vault)`) and `ca` (the `InstallationCA`); the
    context's `upstream_tls` is how service upstreams are verified (default: the system trust
    store, see `upstream_tls_context`), and its `listeners` are the installation's own
    (`InstallationListeners.of(settings)`): never reached, whatever the rules say.
    """

    def __init__(
        self,
        sandbox_id: str,
        socket_path: Path,
        rules: EgressRules,
        context: EgressContext,
        limits: ProxyLimits | None = None,
        *,
        services: ServiceSet | None = None,
    ):
        if not isinstance(rules, EgressRules):
            raise TypeError("EgressProxy expects an EgressRules")
        self.sandbox_id = sandbox_id
        self.socket_path = Path(socket_path)
        self.limits = limits = limits or ProxyLimits()
        self._secrets = context.secrets_of(sandbox_id)
        self._leaves = context.leaves_of(sandbox_id)
        self._sink = context.sink
        # `default: ask` destinations; a run sets `approvals.approver` to put them to a person.
        self.approvals = EgressApprovals()
        self._meter = meter = Meter(lambda: self._decider.rules.max_bytes_out)
        self._decider = decider = Decider(
            rules,
            ServiceSet(),
            context.resolver,
            context.listeners or InstallationListeners(),
            self.approvals,
            meter.spent,
        )
        self.update_services(services or ServiceSet())
        connector = Connector(limits, context.upstream_tls)
        bodies = Bodies(limits, meter)
        self._tunnels = Tunnels(decider, connector, bodies, self._leaves)
        self._forwarding = Forwarding(decider, connector, bodies)
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._records: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._closing = False  # close() under way: connections are cut, not flushed
        self.ledger_failures = 0
        self.audit_failures = 0  # `secret.use` records that could not be written

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._server = await listen_private(
            self.socket_path,
            self._serve,
            limit=self.limits.max_head_bytes,
            backlog=self.limits.max_connections,
        )

    async def close(self) -> None:
        """Stop listening, cut open connections, wait until every ledger event is recorded."""
        self._closing = True
        stop_listening(self._server, self.socket_path)
        self._server = None
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        await self.approvals.close()
        await self.flush()

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
        return self._decider.rules

    def update_rules(self, rules: EgressRules) -> None:
        """Replace the rule set; every connection or request judged from now on uses it."""
        if not isinstance(rules, EgressRules):
            raise TypeError("update_rules expects an EgressRules")
        self._decider.rules = rules

    @property
    def services(self) -> ServiceSet:
        return self._decider.services

    def update_services(self, services: ServiceSet) -> None:
        """Replace the granted services; every connection or request judged from now on uses
        them (an intercepted tunnel whose service is gone gets 403 on its next request)."""
        if not isinstance(services, ServiceSet):
            raise TypeError("update_services expects a ServiceSet")
        if len(services) and (self._leaves is None or self._secrets is None):
            raise ValueError(
                "services need the proxy to have a CA (ca= or leaves_for=) and a secret reader"
            )
        self._decider.services = services

    @property
    def listeners(self) -> InstallationListeners:
        return self._decider.listeners

    def stats(self) -> EgressStats:
        m = self._meter
        return EgressStats(m.bytes_up, m.bytes_down, m.attempts, m.refused, len(self._connections))

    # -- one client connection -------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        connection = next(self._ids)
        try:
            if len(self._connections) > self.limits.max_connections:
                attempt = Attempt("overload")
                attempt.decision = Decision(
                    False, "proxy: too many connections", "this sandbox has too many connections"
                )
                attempt.status = 503
                await self._answer(writer, Refusal(503, attempt.decision.rule, attempt.reason))
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
            if await self._serve_requests(reader, writer, connection):
                await self._linger(reader, writer)
        finally:
            _end(writer, cut=self._closing)
            self._connections.discard(task)

    async def _serve_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: int
    ) -> bool:
        """Requests on one client connection until it ends; an intercepted CONNECT switches
        the same loop to the requests inside the guest's TLS (`tunnel`). True when it ended
        with a refusal sent to a client that may still be sending (see `_linger`)."""
        upstream: Upstream | None = None
        tunnel: Intercepted | None = None
        credentials = (
            HeldCredentials(self._secrets, self.sandbox_id, connection)
            if self._secrets is not None
            else None
        )
        attempt = Attempt("http")
        served = 0  # attempts recorded on this connection
        try:
            while True:
                attempt = self._new_attempt(tunnel)
                try:
                    head = await read_request_head(reader, self.limits)
                except NoRequest as end:
                    if served == 0:  # an empty connection is recorded once, as such
                        attempt = Attempt("idle")
                        attempt.decision = Decision(False, end.rule, end.reason)
                    return False
                served += 1
                if head.method == "CONNECT":
                    if tunnel is not None:
                        raise Refusal(400, "client: malformed", "CONNECT inside a TLS tunnel")
                    attempt = Attempt("connect")
                    if upstream is not None:
                        await upstream.close()
                        upstream = None
                    tunnel = await self._tunnels.serve(head, reader, writer, attempt)
                    if tunnel is None:
                        return False
                    self._emit(connection, attempt)  # the interception itself; calls follow
                    continue
                attempt = self._new_attempt(tunnel)
                upstream, keep_going = await self._forwarding.forward(
                    head, reader, writer, attempt, upstream, tunnel, credentials
                )
                self._emit(connection, attempt)
                if not keep_going:
                    return False
        except Refusal as refusal:
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
                self._emit(connection, attempt)  # recorded before the answer can stall
                await self._answer(writer, refusal)
                return True
        except CapReached:
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
                _end(upstream.writer, cut=self._closing)
            if credentials:
                self._track(self._release(credentials))
        return False

    @staticmethod
    def _new_attempt(tunnel: Intercepted | None) -> Attempt:
        if tunnel is None:
            return Attempt("http")
        attempt = Attempt("service", service=tunnel.service)
        attempt.host, attempt.port = str(tunnel.host), tunnel.port
        return attempt

    async def _answer(self, writer: asyncio.StreamWriter, refusal: Refusal) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            writer.write(refusal_response(refusal))
            await writer.drain()

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """After a refusal: half-close, then read and drop what the client still sends (the
        rest of an over-long head, a body) until it closes, within `linger_time` and
        `linger_bytes`. Closing with unread bytes would reset the connection, and a client
        (or the guest's forwarder) would then lose the refusal it has not read yet."""
        limits = self.limits
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
        dropped = 0
        with contextlib.suppress(TimeoutError, ConnectionError, ssl.SSLError):
            async with asyncio.timeout(limits.linger_time):
                while dropped < limits.linger_bytes:
                    data = await reader.read(limits.chunk_bytes)
                    if not data:
                        return
                    dropped += len(data)

    def _emit(self, connection: int, attempt: Attempt) -> None:
        decision = attempt.decision
        assert decision is not None
        attempt.emitted = True
        meter = self._meter
        meter.attempts += 1
        if not decision.allowed:
            meter.refused += 1
        event = EgressEvent(
            sandbox_id=self.sandbox_id,
            time=attempt.wall,
            connection=connection,
            kind=attempt.kind,
            host=attempt.host,
            port=attempt.port,
            address=attempt.address,
            decision="cut" if attempt.cut else ("allowed" if decision.allowed else "refused"),
            rule=decision.rule,
            reason=decision.reason,
            status=attempt.status,
            bytes_up=attempt.bytes_up,
            bytes_down=attempt.bytes_down,
            duration=round(time.monotonic() - attempt.started, 6),
            service=attempt.service,
            secrets=attempt.secrets,
        )
        self._track(self._record(event))

    def _track(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a record's write in the background; `flush` (and `close`) wait for it."""
        task = asyncio.get_running_loop().create_task(work)
        self._records.add(task)
        task.add_done_callback(self._records.discard)

    async def _release(self, credentials: HeldCredentials) -> None:
        try:
            await credentials.close()
        except Exception:
            self.audit_failures += 1
            log.exception("egress proxy %s: secret use record failed", self.sandbox_id)

    async def _record(self, event: EgressEvent) -> None:
        try:
            await self._sink.record(event)
        except Exception:
            self.ledger_failures += 1
            log.exception("egress proxy %s: ledger sink failed", self.sandbox_id)


def _end(writer: asyncio.StreamWriter, *, cut: bool) -> None:
    """Close a connection; `cut` (the proxy is closing): at once, unsent bytes dropped, so a
    peer that stopped reading cannot keep its descriptor open past the sandbox's end."""
    if cut:
        writer.transport.abort()
    else:
        writer.close()
