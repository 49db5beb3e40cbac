"""Plain forwarding and service calls: one request up, its response down.

`Forwarding.forward` serves one request that is not a CONNECT: an absolute-form plain-HTTP
request (`GET http://host/path`), or an origin-form request inside an intercepted tunnel. It
checks the target, asks the one decision (`decision.py`), holds and checks a chunked body
(`bodies.py`), reuses a kept-alive upstream connection only for the same place and only if its
address still passes, sends the request in origin form with hop-by-hop fields removed, and
relays the response with its framing checked.

Service calls (the destination is a granted service's origin): the guest's headers of the
credential's names are dropped and the credential added (`services.py`), `Accept-Encoding:
identity` is asked for, the upstream is spoken to over TLS when the service is https, and the
response — status line, headers and body (after gzip/deflate decoding) — is scrubbed of every
form of the secret values (`scrub.py`), its body re-framed as chunked (or until close for an
HTTP/1.0 guest) since its length changes. The ledger names the service and the secret names.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from aamp.egress import splice
from aamp.egress.bodies import Bodies, HeldBody
from aamp.egress.decision import Decider
from aamp.egress.held_credentials import HeldCredentials
from aamp.egress.http1 import (
    HOP_BY_HOP,
    Framing,
    Refusal,
    RequestHead,
    absolute_target,
    check_host_header,
    read_response_head,
    request_framing,
    response_framing,
)
from aamp.egress.intercept import (
    CREDENTIAL_RULE,
    NOT_GRANTED_RULE,
    Intercepted,
    tunnel_target,
)
from aamp.egress.limits import ProxyLimits
from aamp.egress.meter import Attempt, Meter
from aamp.egress.scrub import BodyDecoder, Scrubber, UnsupportedEncoding
from aamp.egress.services import Credential, CredentialError, Service
from aamp.egress.tls_socket import TLSSocketTransport
from aamp.egress.upstream import Connector, Upstream
from aamp.policy.hosts import Host

# Response headers dropped when a service response is scrubbed: its bytes change.
_BODY_DIGESTS = frozenset({"content-md5", "digest", "content-digest", "repr-digest"})


class Forwarding:
    """Plain requests and service calls of one sandbox (`bodies` brings its limits and meter;
    each connection brings the service credentials it holds, `HeldCredentials`)."""

    def __init__(self, decider: Decider, connector: Connector, bodies: Bodies):
        self.decider, self.connector, self.bodies = decider, connector, bodies
        self.limits: ProxyLimits = bodies.limits
        self.meter: Meter = bodies.meter

    async def forward(
        self,
        head: RequestHead,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        attempt: Attempt,
        upstream: Upstream | None,
        tunnel: Intercepted | None = None,
        credentials: HeldCredentials | None = None,
    ) -> tuple[Upstream | None, bool]:
        """Serve one request (`credentials`: those of the client connection). Returns the
        upstream connection to keep (or None) and whether the client connection stays open
        for another request."""
        if tunnel is None:
            host, port, authority, path = absolute_target(head.target)
            attempt.host, attempt.port = str(host), port
            check_host_header(head, host, port, 80)
        else:
            host, port, authority, path = tunnel_target(head, tunnel)
            # Said first: the tunnel may have been open only thanks to the grant.
            granted = self.decider.services.for_destination(host, port)
            if granted is None or granted.name != tunnel.service:
                raise Refusal(
                    403,
                    NOT_GRANTED_RULE,
                    f"service {tunnel.service} is no longer granted to this sandbox",
                )
        framing = request_framing(head)
        expect = head.get("expect")
        if expect is not None and expect.lower() != "100-continue":
            raise Refusal(417, "client: expectation", "only Expect: 100-continue is supported")
        # A kept-alive upstream to the same place: its address is checked again, not resolved.
        connected = upstream.address if upstream and upstream.open_to(host, port) else None
        verdict = await self.decider.decide(host, port, connected=connected)
        attempt.decision = verdict.decision
        if not verdict.allowed:
            if verdict.address is not None:
                attempt.address = str(verdict.address)
            raise Refusal(verdict.status, verdict.decision.rule, verdict.decision.reason)
        service = verdict.service
        credential: Credential | None = None
        if service is not None:
            attempt.service = service.name
            attempt.secrets = service.secret_names
            credential = await self._credential(service, head, host, credentials)
        tls = service is not None and service.tls
        if expect is not None:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        held = await self.bodies.hold_chunked(reader) if framing.kind == "chunked" else None
        if upstream is not None and not (
            connected is not None and verdict.addresses == (connected,) and upstream.tls == tls
        ):
            await upstream.close()
            upstream = None
        if upstream is None:
            upstream = await self.connector.open(host, port, verdict.addresses, attempt, tls=tls)
        attempt.address = str(upstream.address)
        try:
            client_keep, upstream_keep = await self._exchange(
                head, path, authority, framing, held, reader, writer, upstream, attempt, credential
            )
        except BaseException:
            await upstream.close()
            raise
        if not upstream_keep:
            await upstream.close()
            upstream = None
        return upstream, client_keep

    @staticmethod
    async def _credential(
        service: Service, head: RequestHead, host: Host, credentials: HeldCredentials | None
    ) -> Credential:
        if credentials is None:  # pragma: no cover - update_services refuses this
            raise Refusal(503, CREDENTIAL_RULE, "this proxy has no secret reader")
        try:
            return await credentials.for_request(service, head.method, host)
        except CredentialError as exc:
            raise Refusal(503, CREDENTIAL_RULE, str(exc)) from None

    async def _exchange(
        self,
        head: RequestHead,
        path: str,
        authority: str,
        framing: Framing,
        held: HeldBody | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: Upstream,
        attempt: Attempt,
        credential: Credential | None = None,
    ) -> tuple[bool, bool]:
        """Send one request upstream and its response back. Returns (client keep-alive,
        upstream reusable). With a `credential` (a service call) its headers replace the
        guest's of the same name and the response is scrubbed of its secret values."""
        tokens = head.connection_tokens()
        drop = HOP_BY_HOP | tokens
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
        if framing.kind == "chunked":
            lines.append("Transfer-Encoding: chunked")
        out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        del lines
        if held is not None:
            out += held.data  # the head and the checked start of the body, in one write
        if framing.kind == "length":  # the head goes in the body's first write
            await self.bodies.copy_length(
                reader,
                upstream.writer,
                framing.length,
                attempt,
                up=True,
                source_writer=writer,
                head=out,
            )
        else:
            self.meter.send_up(upstream.writer, out, attempt)
        del out
        if framing.kind == "chunked":
            await self.bodies.copy_chunked(
                reader, upstream.writer, attempt, up=True, source_writer=writer, held=held
            )
        await upstream.writer.drain()
        client_keep = (
            "close" not in tokens if head.version == "HTTP/1.1" else "keep-alive" in tokens
        )
        scrubber = Scrubber(credential.scrub_forms) if credential is not None else None
        return await self._respond(head, writer, upstream, attempt, scrubber, client_keep)

    async def _respond(
        self,
        head: RequestHead,
        writer: asyncio.StreamWriter,
        upstream: Upstream,
        attempt: Attempt,
        scrubber: Scrubber | None,
        client_keep: bool,
    ) -> tuple[bool, bool]:
        """Relay the upstream's response to the guest (scrubbed for a service call)."""
        send_down = self.meter.send_down
        while True:
            response = await read_response_head(upstream.reader, self.limits)
            status = response.status
            if status == 101:
                raise Refusal(502, attempt.decision.rule, "unexpected 101 from upstream")
            if 100 <= status < 200:
                raw = response.raw if scrubber is None else scrubber.scrub(response.raw)
                send_down(writer, raw, attempt)
                continue
            break
        attempt.status = status
        rtokens = response.connection_tokens()
        upstream_keep = response.version == "HTTP/1.1" and "close" not in rtokens
        rdrop = HOP_BY_HOP | rtokens
        body = response_framing(head.method, response)
        if body.kind == "eof":
            client_keep = False
            upstream_keep = False
        # How the body goes to the guest: as it came, or (scrubbed) re-framed.
        down = body.kind
        decoder: BodyDecoder | None = None
        status_line = response.status_line
        # The fields are scrubbed one by one only if a form occurs somewhere in the raw head
        # (which holds every field's bytes): then none can occur in any of them.
        fields = scrubber if scrubber is not None and scrubber.finds(response.raw) else None
        if fields is not None:
            status_line = fields.scrub(status_line.encode("latin-1")).decode("latin-1")
        if scrubber is not None and body.kind != "none":
            encodings = response.get_all("content-encoding")
            try:
                decoder = BodyDecoder(", ".join(encodings))
            except UnsupportedEncoding as exc:
                raise Refusal(502, attempt.decision.rule, str(exc)) from None
            rdrop = rdrop | {"content-length"} | _BODY_DIGESTS
            if decoder.decoding:
                rdrop = rdrop | {"content-encoding"}
            down = "chunked" if head.version == "HTTP/1.1" else "eof"
            if down == "eof":
                client_keep = False
        out_lines = [status_line]
        for (name, value), raw in zip(response.headers, response.raw_names, strict=True):
            if name not in rdrop:
                if fields is not None:
                    raw = fields.scrub(raw.encode("latin-1")).decode("latin-1")
                    value = fields.scrub(value.encode("latin-1")).decode("latin-1")
                out_lines.append(f"{raw}: {value}")
        if down == "chunked":
            out_lines.append("Transfer-Encoding: chunked")
        if not client_keep:
            out_lines.append("Connection: close")
        elif head.version == "HTTP/1.0":
            out_lines.append("Connection: keep-alive")
        response_head = ("\r\n".join(out_lines) + "\r\n\r\n").encode("latin-1")
        bodies = self.bodies
        # The head goes out with the body's first bytes where it can: one socket write (over
        # TLS one record) instead of two, which is most of a small response's cost.
        if decoder is not None:
            assert scrubber is not None
            await self._scrub_body(
                upstream.reader,
                writer,
                response_head,
                body,
                down,
                decoder,
                scrubber,
                attempt,
                upstream.writer.transport,
            )
        elif body.kind == "length":
            await bodies.copy_length(
                upstream.reader,
                writer,
                body.length,
                attempt,
                up=False,
                source_writer=upstream.writer,
                head=response_head,
            )
        else:
            send_down(writer, response_head, attempt)
            if body.kind == "chunked":
                await bodies.copy_chunked(
                    upstream.reader, writer, attempt, up=False, source_writer=upstream.writer
                )
            elif body.kind == "eof":
                if await bodies.splice_body(
                    upstream.reader, upstream.writer, writer, attempt, up=False, length=None
                ):
                    with contextlib.suppress(OSError, RuntimeError):
                        if writer.can_write_eof():
                            writer.write_eof()
                else:
                    await bodies.pump(upstream.reader, writer, attempt, up=False)
        await writer.drain()
        return client_keep, upstream_keep

    async def _scrub_body(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        head: bytes,
        body: Framing,
        down: str,
        decoder: BodyDecoder,
        scrubber: Scrubber,
        attempt: Attempt,
        source_transport: asyncio.BaseTransport | None = None,
    ) -> None:
        """Send the response `head`, then decode the upstream body's framing and coding,
        scrub it and send it `down` (chunked, or until close for an HTTP/1.0 guest).

        What is ready goes out in one write before each wait for the guest: over TLS that is
        one encryption pass and one socket write for the chunk header, the data and the CRLF
        together, and for a small body the head, its one chunk and the last chunk.
        The head waits for the first body bytes the scrubber lets go (or the body's end),
        which it holds back anyway until it has seen past them."""
        chunked = down == "chunked"
        meter = self.meter
        ready: list[bytes | memoryview] = [head]
        body_ready = False

        def add(pieces: tuple[bytes | memoryview, ...] | list[bytes | memoryview]) -> None:
            nonlocal body_ready
            size = sum(len(p) for p in pieces)
            if not size:
                return
            if chunked:
                ready.append(b"%x\r\n" % size)
            ready.extend(pieces)
            if chunked:
                ready.append(b"\r\n")
            body_ready = True

        def send() -> bool:
            nonlocal body_ready
            if not body_ready:
                return False
            size = sum(len(p) for p in ready)
            # One write: TLS makes records per write (a 6-byte chunk header would be a record
            # of its own, for the guest to decrypt too); `TLSSocketTransport.writelines` joins
            # the small pieces and sends a large one's whole records without copying them.
            sink.writelines(ready)
            meter.count(attempt, size, up=False)
            ready.clear()
            body_ready = False
            return True

        try:
            if (
                body.kind == "length"
                and not decoder.decoding
                and isinstance(source_transport, TLSSocketTransport)
                and isinstance(sink.transport, TLSSocketTransport)
            ):
                await _relay_length(
                    source, source_transport, sink, body.length, scrubber, add, send
                )
                body = Framing("length", 0)  # all of it went; the decoder saw nothing
            async for piece in self.bodies.pieces(source, body):
                for decoded in decoder.feed(piece):
                    add(scrubber.feed_pieces(decoded))
                    if send():
                        await sink.drain()
            add((scrubber.feed(decoder.flush()),))
        except UnsupportedEncoding as exc:
            raise Refusal(502, attempt.decision.rule, str(exc)) from None
        add((scrubber.flush(),))
        if chunked:
            ready.append(b"0\r\n\r\n")
        body_ready = True
        send()


async def _relay_length(
    source: asyncio.StreamReader,
    transport: TLSSocketTransport,
    sink: asyncio.StreamWriter,
    length: int,
    scrubber: Scrubber,
    add: Callable[[tuple[bytes | memoryview, ...]], None],
    send: Callable[[], bool],
) -> None:
    """Scrub and send a `length`-byte upstream body straight from the upstream transport's
    receive buffer (`TLSSocketTransport.tap`): no StreamReader, no read(), the guest's
    transport joining each write into its own buffer. The same scrubber and `send` (meter
    included) as the read path; while the guest's write buffer is over its high mark the
    upstream is not read (`drain`), so a slow guest holds back the upstream, not memory."""
    high = sink.transport.get_write_buffer_limits()[1]  # type: ignore[attr-defined]
    guest = sink.transport

    def deliver(view: memoryview) -> bool:
        add(scrubber.feed_pieces(view))  # type: ignore[arg-type]
        send()  # consumes `view` now: the buffer is read into again after this returns
        return guest.get_write_buffer_size() <= high

    with splice.reading_paused(source, transport):
        ahead = splice.read_ahead(source)
        if ahead:  # what the reader holds already goes first, the same way
            data = bytes(ahead[:length])
            del ahead[: len(data)]
            length -= len(data)
            deliver(memoryview(data))
        while length:
            await sink.drain()
            try:
                length = await transport.tap(length, deliver)
            finally:
                transport.untap()  # cancelled (the proxy closing): nothing more is delivered
