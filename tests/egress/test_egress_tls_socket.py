"""TLS interception over `tls_socket.TLSSocketTransport`, attacked from both sides.

Hostile service upstreams (real TLS servers scripted byte by byte): one that trickles its
response a few bytes per record, one that sends more than its Content-Length, ones that end
mid-body with close_notify or by dropping TCP, one that never finishes. A guest that opens
more intercepted connections than its limit, and one that stops reading a large download
while the proxy closes. Every case checks what reached the guest (secrets scrubbed, nothing
past the framing, a truncated body never looking complete), the ledger, and that no
descriptor is left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import ssl
import tracemalloc

import pytest
from egress_tls import client_context, make_upstream_tls, open_tls_tunnel, request

from aamp.audit import AuditLog
from aamp.config import Settings
from aamp.egress.ca import InstallationCA
from aamp.egress.intercept import upstream_tls_context
from aamp.egress.ledger import JsonLinesSink
from aamp.egress.limits import ProxyLimits
from aamp.egress.proxy import EgressContext, EgressProxy
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules
from aamp.egress.services import Bearer, Service, ServiceSet, VaultSecretReader
from aamp.egress.tls_streams import handshake, open_stream
from aamp.store import Store
from aamp.vault import Vault

SANDBOX = "sb-0000000000c7"
TOKEN = "tok-Rw3Yb8Qe1Ux5Pn2M"
HOST = "svc.test"


def open_sockets() -> int:
    """Sockets this process holds (the vault's database pool may open files meanwhile)."""
    gc.collect()  # the test's own failed client sockets
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


class ScriptedUpstream:
    """A TLS server whose every connection runs `script(reader, writer)` after the head."""

    def __init__(self, context: ssl.SSLContext):
        self.context = context
        self.script = None
        self.heads: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> ScriptedUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.10", 0, ssl=self.context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._server.close_clients() if hasattr(self._server, "close_clients") else None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                if not await self.script(head, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.transport.abort()


@pytest.fixture
async def vault(tmp_path):
    home = tmp_path / "home"
    settings = Settings(home=home, runtime_dir=tmp_path / "run", image_dir=home / "images")
    store = Store.open(settings)
    async with AuditLog.open(settings, store) as log:
        v = Vault.open(settings, store, log)
        await v.put("svc_token", TOKEN, actor="user:admin")
        yield v
    store.close()


@pytest.fixture
def ca(tmp_path):
    return InstallationCA.load_or_create(tmp_path / "home" / "ca")


@pytest.fixture
def upstream_tls(tmp_path):
    return make_upstream_tls(tmp_path / "upstream-tls", [HOST])


@pytest.fixture
async def upstream(upstream_tls):
    async with ScriptedUpstream(upstream_tls[0]) as server:
        yield server


@pytest.fixture
def sink(sockdir):
    return JsonLinesSink(sockdir / "ledger.jsonl")


def make_proxy(sockdir, sink, vault, ca, upstream_tls, port, **limits) -> EgressProxy:
    return EgressProxy(
        SANDBOX,
        sockdir / "egress.sock",
        EgressRules.from_lists("block", allow=[HOST]),
        EgressContext(
            StaticResolver({HOST: ["127.0.0.10"]}),
            sink,
            secrets=VaultSecretReader(vault),
            ca=ca,
            upstream_tls=upstream_tls_context(upstream_tls[1]),
        ),
        ProxyLimits(**limits),
        services=ServiceSet([Service("svc", f"https://{HOST}:{port}", Bearer("svc_token"))]),
    )


async def tunnel(proxy, ca, port):
    return await open_tls_tunnel(
        proxy.socket_path, f"{HOST}:{port}", client_context(ca.cert_path), HOST
    )


async def read_raw(reader: asyncio.StreamReader, seconds: float = 10) -> bytes:
    """Everything the guest gets until the proxy ends the connection."""
    out = bytearray()
    async with asyncio.timeout(seconds):
        while chunk := await reader.read(65536):
            out += chunk
    return bytes(out)


async def test_a_trickling_upstream_is_relayed_whole_and_scrubbed(
    sockdir, sink, vault, ca, upstream_tls, upstream
):
    body = b"token=" + TOKEN.encode() + b"; " + b"x" * 3000 + TOKEN.encode()

    async def trickle(head, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        for at in range(0, len(body), 7):  # a TLS record every 7 bytes: the token split
            writer.write(body[at : at + 7])
            await writer.drain()
            await asyncio.sleep(0)
        return True

    upstream.script = trickle
    async with make_proxy(sockdir, sink, vault, ca, upstream_tls, upstream.port) as proxy:
        reader, writer = await tunnel(proxy, ca, upstream.port)
        first = await request(reader, writer, "/", f"{HOST}:{upstream.port}")
        second = await request(reader, writer, "/", f"{HOST}:{upstream.port}")
        writer.close()
    for response in (first, second):
        assert response.status == 200
        assert TOKEN.encode() not in response.body
        assert len(response.body) == len(body) - 2 * len(TOKEN) + 2 * 8  # two markers
        assert response.body.count(b"x") == 3000
    assert [e.kind for e in sink.read()] == ["connect", "service", "service"]


async def test_bytes_past_content_length_never_reach_the_guest(
    sockdir, sink, vault, ca, upstream_tls, upstream
):
    async def overlong(head, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" + b"SMUGGLED" * 64)
        await writer.drain()
        return True

    upstream.script = overlong
    async with make_proxy(sockdir, sink, vault, ca, upstream_tls, upstream.port) as proxy:
        reader, writer = await tunnel(proxy, ca, upstream.port)
        first = await request(reader, writer, "/", f"{HOST}:{upstream.port}")
        # The extra bytes are where the next response head should be: refused, not relayed.
        second = await request(reader, writer, "/", f"{HOST}:{upstream.port}")
        rest = await read_raw(reader)
        writer.close()
    assert (first.status, first.body) == (200, b"hello")
    assert second.status == 502 and second.headers["x-aamp-egress-rule"] == "upstream: malformed"
    assert b"SMUGGLED" not in second.body + rest


@pytest.mark.parametrize("ending", ["close_notify", "tcp_drop"])
async def test_an_upstream_ending_mid_body_never_looks_complete(
    sockdir, sink, vault, ca, upstream_tls, upstream, ending
):
    async def cut_short(head, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"y" * 40000)
        await writer.drain()
        if ending == "close_notify":
            writer.close()  # asyncio's TLS sends close_notify first
            await writer.wait_closed()
        else:
            writer.transport.abort()  # TCP ends with no close_notify
        return False

    upstream.script = cut_short
    async with make_proxy(sockdir, sink, vault, ca, upstream_tls, upstream.port) as proxy:
        reader, writer = await tunnel(proxy, ca, upstream.port)
        writer.write(f"GET / HTTP/1.1\r\nHost: {HOST}:{upstream.port}\r\n\r\n".encode())
        raw = await read_raw(reader)
        writer.close()
        await proxy.flush()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    assert not body.endswith(b"0\r\n\r\n")  # no last chunk: the guest sees a cut body
    assert 0 < body.count(b"y") <= 40000
    service = [e for e in sink.read() if e.kind == "service"]
    assert len(service) == 1 and service[0].status == 200
    assert 0 < service[0].bytes_down < 100000


async def test_the_guest_limit_holds_and_nothing_leaks(
    sockdir, sink, vault, ca, upstream_tls, upstream
):
    async def small(head, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        return True

    upstream.script = small
    before = open_sockets()
    limit = 8
    proxy = make_proxy(sockdir, sink, vault, ca, upstream_tls, upstream.port, max_connections=limit)
    async with proxy:
        results = await asyncio.gather(
            *(tunnel(proxy, ca, upstream.port) for _ in range(limit + 4)),
            return_exceptions=True,
        )
        opened = [r for r in results if not isinstance(r, BaseException)]
        # The rest were refused: a 503, a reset if the refusal's close beat its reading, or
        # the listener's backlog (as long as the limit) was full (on uvloop a connect to a
        # full Unix-socket backlog fails at once with EAGAIN, where asyncio's own loop waits).
        assert len(opened) == limit
        refused = (ConnectionError, BlockingIOError)
        assert all(isinstance(r, refused) for r in results if r not in opened)
        answers = await asyncio.gather(
            *(request(r, w, "/", f"{HOST}:{upstream.port}") for r, w in opened)
        )
        assert [a.body for a in answers] == [b"ok"] * limit
        for _, w in opened:
            w.close()
        async with asyncio.timeout(5):
            while proxy.stats().open_connections:
                await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert open_sockets() <= before
    events = sink.read()
    assert sum(e.kind == "connect" for e in events) == limit  # only those got through
    assert {e.status for e in events if e.kind == "overload"} <= {503}


async def test_closing_the_proxy_cuts_a_guest_that_stopped_reading(
    sockdir, sink, vault, ca, upstream_tls, upstream
):
    size = 64 * 1024 * 1024

    async def huge(head, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        block = b"z" * (1024 * 1024)
        for _ in range(size // len(block)):
            writer.write(block)
            await writer.drain()
        return True

    async def never(head, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        await asyncio.Event().wait()  # never sends the rest, never closes
        return False

    before = open_sockets()
    upstream.script = huge
    proxy = make_proxy(sockdir, sink, vault, ca, upstream_tls, upstream.port)
    await proxy.start()
    _stalled_r, stalled_w = await tunnel(proxy, ca, upstream.port)
    stalled_w.write(f"GET / HTTP/1.1\r\nHost: {HOST}:{upstream.port}\r\n\r\n".encode())
    await asyncio.sleep(0.5)  # the proxy fills the guest's socket; the guest reads nothing
    upstream.script = never
    hung_r, hung_w = await tunnel(proxy, ca, upstream.port)
    hung_w.write(f"GET / HTTP/1.1\r\nHost: {HOST}:{upstream.port}\r\n\r\n".encode())
    await asyncio.sleep(0.2)
    async with asyncio.timeout(3):  # promptly, though one guest never reads, one upstream hangs
        await proxy.close()
    assert proxy.stats().open_connections == 0
    assert len(await read_raw(hung_r, 3)) < 200  # ended: the head and 3 bytes at most
    stalled_w.close()
    hung_w.close()
    await asyncio.sleep(0.05)
    assert open_sockets() <= before + 1  # the stalled guest's own end may still be closing
    kinds = sorted(e.kind for e in sink.read())
    assert kinds == ["connect", "connect", "service", "service"]


def test_renegotiation_is_refused_on_both_sides(ca, upstream_tls):
    assert ca.server_context(HOST).options & ssl.OP_NO_RENEGOTIATION
    assert upstream_tls_context(upstream_tls[1]).options & ssl.OP_NO_RENEGOTIATION


def dechunk(body: bytes) -> bytes:
    out, at = bytearray(), 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end], 16)
        if not size:
            return bytes(out)
        out += body[end + 2 : end + 2 + size]
        at = end + 4 + size


async def test_a_slow_guest_holds_back_the_upstream_and_then_gets_every_byte_scrubbed(
    sockdir, sink, vault, ca, upstream_tls, upstream
):
    # The body is relayed from the upstream transport's receive buffer (`tap`), not through
    # a StreamReader: a guest that stops reading must stop the upstream being read, not
    # make the proxy buffer the body; when it reads again, the relay resumes where it was.
    block = b"w" * (1024 * 1024 - len(TOKEN)) + TOKEN.encode()  # a token per MiB, at seams
    count = 40
    sent = 0

    async def big(head, writer):
        nonlocal sent
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (count * len(block)))
        for _ in range(count):
            writer.write(block)
            await writer.drain()
            sent += len(block)
        return True

    upstream.script = big
    async with make_proxy(sockdir, sink, vault, ca, upstream_tls, upstream.port) as proxy:
        reader, writer = await tunnel(proxy, ca, upstream.port)
        writer.write(
            f"GET / HTTP/1.1\r\nHost: {HOST}:{upstream.port}\r\nConnection: close\r\n\r\n".encode()
        )
        await asyncio.sleep(1.5)  # the guest reads nothing: every buffer on the way fills
        stalled = sent
        await asyncio.sleep(1.0)
        assert sent == stalled  # nothing more was taken from the upstream meanwhile
        assert stalled <= count * len(block) // 2  # kernel buffers, not the body, are held
        raw = await read_raw(reader, 60)
        writer.close()
        await proxy.flush()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    data = dechunk(body)
    assert TOKEN.encode() not in data
    assert data.count(b"w") == count * (len(block) - len(TOKEN))
    assert len(data) == count * (len(block) - len(TOKEN) + 8)  # each token one marker
    service = [e for e in sink.read() if e.kind == "service"]
    assert len(service) == 1 and service[0].status == 200
    assert service[0].bytes_down == len(raw)  # every byte the guest got, counted once


async def _transport_and_raw_peer(ca, send_buffer: int):
    """A `TLSSocketTransport` (server side) and its peer as an `SSLObject` over raw reads, so
    the peer sees every TLS record the transport wrote. With a small `send_buffer` the
    transport's writes block part-way unless the peer reads."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    theirs.setblocking(False)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    peer = client_context(ca.cert_path).wrap_bio(incoming, outgoing, server_hostname=HOST)
    loop = asyncio.get_running_loop()
    shaken = asyncio.ensure_future(
        handshake(ours, ca.server_context(HOST), server_side=True, timeout=10)
    )
    while True:
        try:
            peer.do_handshake()
            break
        except ssl.SSLWantReadError:
            await loop.sock_sendall(theirs, outgoing.read())
            incoming.write(await loop.sock_recv(theirs, 65536))
    await loop.sock_sendall(theirs, outgoing.read())
    _reader, writer = open_stream(await shaken, ca.server_context(HOST), limit=65536)
    writer.write(b"!")  # the session tickets go out with the first write: read them now
    assert await _read_records(theirs, peer, incoming, 1) == (b"!", 3)
    return writer, theirs, peer, incoming


async def _read_records(theirs, peer, incoming, want: int) -> tuple[bytes, int]:
    """Decrypt `want` bytes; (the bytes, how many application-data records carried them)."""
    loop = asyncio.get_running_loop()
    raw, out, records = bytearray(), bytearray(), 0
    async with asyncio.timeout(30):
        while len(out) < want:
            raw += await loop.sock_recv(theirs, 1 << 20)
            while len(raw) >= 5 and len(raw) >= 5 + int.from_bytes(raw[3:5], "big"):
                size = 5 + int.from_bytes(raw[3:5], "big")
                records += raw[0] == 23  # TLS 1.3 sends every record as application data
                incoming.write(bytes(raw[:size]))
                del raw[:size]
            with contextlib.suppress(ssl.SSLWantReadError):
                while chunk := peer.read(1 << 20):
                    out += chunk
    return bytes(out), records


def _relayed(size: int) -> tuple[list[bytes | memoryview], bytearray]:
    """What the scrubbed relay hands the guest leg for one piece: a chunk header, the
    scrubber's held-back tail, a view of the upstream leg's receive buffer, the CRLF."""
    receive = bytearray(os.urandom(size))
    return [b"%x\r\n" % (size + 11), b"held-tail!!", memoryview(receive), b"\r\n"], receive


SIZES = (300 * 1024 + 7, 48 * 1024, 5)


async def test_writelines_makes_no_more_records_than_one_joined_write(ca):
    writer, theirs, peer, incoming = await _transport_and_raw_peer(ca, 4 * 1024 * 1024)
    transport = writer.transport
    for size in SIZES:
        pieces, _ = _relayed(size)
        total = sum(len(p) for p in pieces)
        tracemalloc.start()
        try:
            transport.writelines(pieces)
            copied = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert copied < 64 * 1024  # the large piece was not copied (joined), whatever its size
        assert not transport.get_write_buffer_size()  # it all went at once
        got, records = await _read_records(theirs, peer, incoming, total)
        assert got == b"".join(pieces)
        assert records == -(-total // 16384)  # full 16 KiB records, the last one short
    transport.abort()
    theirs.close()


async def test_writelines_blocked_part_way_sends_the_bytes_it_was_given(ca):
    # The view is of a buffer read into again as soon as writelines returns: what could not
    # go at once waits as a copy, in order, before anything written later.
    writer, theirs, peer, incoming = await _transport_and_raw_peer(ca, 32 * 1024)
    transport = writer.transport
    sent = bytearray()
    for size in SIZES:
        pieces, receive = _relayed(size)
        sent += b"".join(pieces)
        transport.writelines(pieces)
        receive[:] = bytes(size)
    assert transport.get_write_buffer_size()  # the peer read nothing yet: the rest waits
    got, _ = await _read_records(theirs, peer, incoming, len(sent))
    assert got == bytes(sent)
    transport.abort()
    theirs.close()


async def test_writelines_joins_small_pieces_into_one_record(ca):
    writer, theirs, peer, incoming = await _transport_and_raw_peer(ca, 4 * 1024 * 1024)
    pieces = [b"6\r\n", b"abcdef", b"\r\n", b"0\r\n\r\n"]
    writer.transport.writelines(pieces)
    got, records = await _read_records(theirs, peer, incoming, len(b"".join(pieces)))
    assert got == b"".join(pieces) and records == 1
    writer.transport.abort()
    theirs.close()
