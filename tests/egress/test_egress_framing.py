"""Body framing from the untrusted side: a chunked body is checked as its bytes flow, and what
fails to parse never reaches the other side. A recording upstream (it keeps every byte it was
sent) proves "nothing forwarded", and the ledger must say exactly how many bytes went up."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from egress_client import read_response
from egress_upstream import RecordingUpstream, UpstreamServer

from aamp.egress.proxy import EgressContext, EgressProxy, ProxyLimits
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules

SANDBOX = "sb-0000000000fr"
NAMES = {"a.test": ["127.0.0.10"]}
HELD = getattr(ProxyLimits(), "held_body_bytes", 64 * 1024)  # (base: no such limit)


@pytest.fixture
async def proxy(sockdir, sink):
    rules = EgressRules.from_lists("block", allow=["a.test"])
    async with EgressProxy(
        SANDBOX, sockdir / "egress.sock", rules, EgressContext(StaticResolver(NAMES), sink)
    ) as p:
        yield p


async def _post_chunked(proxy, port: int, pieces: list[bytes], pause: float = 0.0):
    """POST a chunked body written in `pieces` (with pauses); the response (or None if the
    connection ended without one)."""
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    head = (
        f"POST http://a.test:{port}/up HTTP/1.1\r\nHost: a.test:{port}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    try:
        writer.write(head)
        for piece in pieces:
            await asyncio.sleep(pause)
            writer.write(piece)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        async with asyncio.timeout(10):
            try:
                return await read_response(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return None
    finally:
        writer.close()


async def _ledger(proxy, sink):
    for _ in range(100):  # the refusal is recorded as soon as it is decided
        await proxy.flush()
        if events := sink.read():
            return events
        await asyncio.sleep(0.02)
    return sink.read()


MALFORMED_BODIES = {
    # name: (body pieces; the last one carries the fault)
    "bad size after a good chunk": [b"5\r\nhello\r\n", b"zz\r\nworld\r\n0\r\n\r\n"],
    "chunk data not followed by CRLF": [b"5\r\nhello", b"XX6\r\n world\r\n0\r\n\r\n"],
    "bare LF in a chunk extension": [b"5;a=b\nX: y\r\nhello\r\n0\r\n\r\n"],
    "bare CR in a chunk extension": [b"5;a\rb\r\nhello\r\n0\r\n\r\n"],
    "malformed chunk extension": [b"5;=b\r\nhello\r\n0\r\n\r\n"],
    "space after the size": [b"5 \r\nhello\r\n0\r\n\r\n"],
    "bare LF in a trailer": [b"5\r\nhello\r\n0\r\nX-T: a\nInjected: 1\r\n\r\n"],
    "bare CR in a trailer": [b"5\r\nhello\r\n0\r\nX-T: a\rb\r\n\r\n"],
    "folded trailer": [b"5\r\nhello\r\n0\r\nX-T: a\r\n b\r\n\r\n"],
    "trailer without a colon": [b"5\r\nhello\r\n0\r\nX-T a\r\n\r\n"],
}


@pytest.mark.parametrize("pause", [0.0, 0.05], ids=["one-write", "trickled"])
@pytest.mark.parametrize("name", list(MALFORMED_BODIES))
async def test_a_malformed_chunked_body_reaches_nothing_upstream(proxy, sink, name, pause):
    """Sent at once or trickled (so that its good start arrives before its fault), a short
    malformed body gets a 400 and the upstream sees no connection and no byte, head
    included. The ledger has one refusal with bytes_up 0."""
    async with RecordingUpstream("127.0.0.10") as upstream:
        response = await _post_chunked(proxy, upstream.port, MALFORMED_BODIES[name], pause)
        await asyncio.sleep(0.05)
    assert response is not None
    assert (response.status, response.rule) == (400, "client: malformed"), response.body
    assert upstream.received == []  # not even a connection
    [event] = await _ledger(proxy, sink)
    assert (event.decision, event.rule, event.status) == ("refused", "client: malformed", 400)
    assert (event.bytes_up, event.address) == (0, None)


async def test_a_long_body_that_turns_malformed_is_cut_and_the_ledger_counts_what_went_up(
    proxy, sink
):
    """Past what the proxy holds, checked pieces go on; the fault itself never does, the
    upstream connection is closed, and bytes_up is exactly what the upstream received."""
    good = [b"%x\r\n" % 40_000 + b"g" * 40_000 + b"\r\n" for _ in range(5)]
    bad = b"5;a\nb\r\nhello\r\n0\r\n\r\n"
    async with RecordingUpstream("127.0.0.10") as upstream:
        response = await _post_chunked(proxy, upstream.port, [*good, bad], pause=0.05)
        for _ in range(100):
            if upstream.ended and upstream.ended[0]:
                break
            await asyncio.sleep(0.02)
    assert response is not None and (response.status, response.rule) == (400, "client: malformed")
    [received] = upstream.received
    assert upstream.ended == [True]
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"POST /up HTTP/1.1\r\n")
    assert len(body) > HELD and b"".join(good).startswith(body)  # a checked prefix, no fault
    [event] = await _ledger(proxy, sink)
    assert (event.decision, event.rule) == ("refused", "client: malformed")
    assert event.bytes_up == len(received) > HELD
    assert proxy.stats().bytes_up == len(received)


async def test_a_body_the_client_abandons_while_held_sends_nothing(proxy, sink):
    async with RecordingUpstream("127.0.0.10") as upstream:
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        writer.write(
            f"POST http://a.test:{upstream.port}/up HTTP/1.1\r\nHost: a.test:{upstream.port}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n5\r\nhel".encode()
        )
        await writer.drain()
        writer.write_eof()
        async with asyncio.timeout(10):
            response = await read_response(reader)
        writer.close()
        await asyncio.sleep(0.05)
    assert (response.status, response.rule) == (400, "client: incomplete body")
    assert upstream.received == []
    [event] = await _ledger(proxy, sink)
    assert (event.rule, event.bytes_up) == ("client: incomplete body", 0)


async def test_well_formed_extensions_and_trailers_pass_byte_for_byte(proxy, sink):
    body = b'5;name=value ; q="a \\" b"\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 1\r\nX-B: 2\r\n\r\n'
    async with RecordingUpstream("127.0.0.10", answer_after=b"X-B: 2\r\n\r\n") as upstream:
        response = await _post_chunked(proxy, upstream.port, [body])
    assert response is not None and (response.status, response.body) == (200, b"ok")
    [received] = upstream.received
    assert bytes(received).endswith(b"\r\n\r\n" + body)
    [event] = await _ledger(proxy, sink)
    assert (event.decision, event.status, event.bytes_up) == ("allowed", 200, len(received))


async def test_a_large_valid_chunked_body_still_arrives_whole(proxy, sink):
    data = bytes(range(256)) * 2048  # 512 KiB, well past what is held
    async with UpstreamServer("127.0.0.10") as upstream:
        pieces = [
            b"%x\r\n" % 100_000 + data[i : i + 100_000] + b"\r\n"
            for i in range(0, len(data), 100_000)
        ]
        pieces[-1] = b"%x\r\n" % len(data[500_000:]) + data[500_000:] + b"\r\n"
        response = await _post_chunked(
            proxy, upstream.port, [*pieces[:-1], pieces[-1] + b"0\r\n\r\n"], pause=0.01
        )
    # /up is not a route: the server answers its hello after reading the whole body
    assert response is not None and response.status == 200
    [event] = await _ledger(proxy, sink)
    assert event.decision == "allowed" and event.bytes_up > len(data)


async def _raw_upstream(response: bytes):
    async def serve(reader, writer):
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(response)
            await writer.drain()
            await asyncio.sleep(0.5)
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.10", 0)


@pytest.mark.parametrize(
    "fault",
    [b"5;a\nb\r\nhello\r\n0\r\n\r\n", b"5\r\nhello\r\n0\r\nX-T: a\nInjected: 1\r\n\r\n"],
    ids=["bare-lf-extension", "bare-lf-trailer"],
)
async def test_an_upstream_chunk_line_with_a_bare_lf_never_reaches_the_guest(proxy, sink, fault):
    server = await _raw_upstream(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + fault)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    try:
        writer.write(f"GET http://a.test:{port}/ HTTP/1.1\r\nHost: a.test:{port}\r\n\r\n".encode())
        async with asyncio.timeout(10):
            received = await reader.read(1 << 20)
            while chunk := await reader.read(1 << 20):
                received += chunk
    finally:
        writer.close()
        server.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"\n" not in body.replace(b"\r\n", b"") and b"Injected" not in body
    [event] = await _ledger(proxy, sink)
    assert event.status == 200 and "bare CR, LF or NUL" in event.reason
    assert "from upstream" in event.reason
