"""Every connection leaves its mark in the ledger, however it ends, and a refusal is read by
the client instead of a connection reset — also through the guest's own forwarder (the real
`Forwarder` from the guest agent, TCP on loopback, as a guest program reaches the proxy)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from egress_client import read_response
from egress_upstream import UpstreamServer

from aamp.egress.proxy import EgressContext, EgressProxy, ProxyLimits
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules
from aamp.guest.endpoint import parse_endpoint
from aamp.guest.forwarder import Forwarder

SANDBOX = "sb-0000000000cn"
NAMES = {"a.test": ["127.0.0.10"], "b.test": ["127.0.0.11"]}
MiB = 1024 * 1024


@pytest.fixture
async def proxy(sockdir, sink):
    rules = EgressRules.from_lists("block", allow=["a.test"])
    limits = ProxyLimits(idle_timeout=0.5, header_timeout=1.0)
    async with EgressProxy(
        SANDBOX, sockdir / "egress.sock", rules, EgressContext(StaticResolver(NAMES), sink), limits
    ) as p:
        yield p


async def _settled(proxy, sink, count: int = 1, wait: float = 5.0):
    """The ledger once the proxy has no open connection and `count` events are in."""
    async with asyncio.timeout(wait):
        while proxy.stats().open_connections or len(sink.read()) < count:
            await proxy.flush()
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # nothing more may arrive
    await proxy.flush()
    return sink.read()


async def _send_and_close(proxy, data: bytes, *, half_close: bool = False) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    try:
        if data:
            writer.write(data)
            await writer.drain()
        if half_close:
            writer.write_eof()
            async with asyncio.timeout(5):
                return await reader.read()
        return b""
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("data", "kind", "rule"),
    [
        (b"", "idle", "client: no request"),
        (b"\r\n", "malformed", "client: incomplete head"),
        (b"GET http://a.test/ HTTP/1.1\r\nHost: a.te", "malformed", "client: incomplete head"),
    ],
    ids=["nothing", "bare-crlf", "partial-head"],
)
async def test_a_connection_that_ends_before_a_head_leaves_one_record(
    proxy, sink, data, kind, rule
):
    await _send_and_close(proxy, data)
    [event] = await _settled(proxy, sink)
    assert (event.kind, event.decision, event.rule) == (kind, "refused", rule)
    assert (event.bytes_up, event.bytes_down, event.address) == (0, 0, None)


async def test_a_partial_head_then_a_half_close_is_answered_and_recorded(proxy, sink):
    answer = await _send_and_close(proxy, b"GET http://a.test/ HTTP/1.1\r\nHo", half_close=True)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"client: incomplete head" in answer
    [event] = await _settled(proxy, sink)
    assert (event.rule, event.status) == ("client: incomplete head", 400)
    assert "after 31 bytes" in event.reason


async def test_an_idle_connection_is_closed_and_recorded(proxy, sink):
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    try:
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # the proxy closed it after idle_timeout
    finally:
        writer.close()
    [event] = await _settled(proxy, sink)
    assert (event.kind, event.rule) == ("idle", "client: idle")
    assert "0.5 s" in event.reason


async def test_requests_on_a_connection_are_its_records_and_its_end_adds_none(proxy, sink):
    async with UpstreamServer("127.0.0.10") as upstream:
        request = f"GET http://a.test:{upstream.port}/ HTTP/1.1\r\nHost: a.test:{upstream.port}"
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        writer.write(f"{request}\r\n\r\n".encode())
        assert (await read_response(reader)).status == 200
        writer.close()  # a clean end after a request: nothing more to record
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        writer.write(f"{request}\r\n\r\n{request}".encode())  # then a partial second head
        assert (await read_response(reader)).status == 200
        writer.close()
        events = await _settled(proxy, sink, 3)
    assert [(e.connection, e.decision, e.rule) for e in events] == [
        (1, "allowed", "allow[0] a.test"),
        (2, "allowed", "allow[0] a.test"),
        (2, "refused", "client: incomplete head"),
    ]


def _big_head(target: str) -> bytes:
    return (
        f"GET {target} HTTP/1.1\r\nHost: {target.split('/')[2]}\r\nX-Big: ".encode()
        + b"a" * MiB
        + b"\r\n\r\n"
    )


async def test_a_1mb_header_gets_the_431_it_is_recorded_with(proxy, sink):
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    try:
        writer.write(_big_head("http://a.test/"))
        await writer.drain()  # the proxy reads it all: no broken pipe half way
        async with asyncio.timeout(10):
            response = await read_response(reader)
    finally:
        writer.close()
    assert (response.status, response.rule) == (431, "client: header too large")
    [event] = await _settled(proxy, sink)
    assert (event.status, event.rule, event.kind) == (431, "client: header too large", "malformed")


@pytest.fixture
def forwarder(proxy):
    """The guest agent's forwarder (what 127.0.0.1:3128 is inside a sandbox), here on an
    ephemeral loopback port, carrying TCP connections to the proxy's Unix socket."""
    fw = Forwarder(parse_endpoint(f"unix:{proxy.socket_path}"), ("127.0.0.1", 0))
    fw.start()
    yield fw.address
    fw.listener.close()


def _tcp_exchange(address, data: bytes) -> bytes:
    """Send everything, then read the answer until the end, as a blocking guest client."""
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.parametrize(
    ("data", "status", "rule"),
    [
        (_big_head("http://a.test/"), 431, "client: header too large"),
        (
            b"POST http://b.test/up HTTP/1.1\r\nHost: b.test\r\nContent-Length: 5242880\r\n\r\n"
            + b"u" * (5 * MiB),
            403,
            "default: block",
        ),
    ],
    ids=["1mb-header", "refused-5mb-upload"],
)
async def test_a_refusal_reaches_a_guest_client_through_the_forwarder_not_a_reset(
    proxy, sink, forwarder, data, status, rule
):
    answer = await asyncio.to_thread(_tcp_exchange, forwarder, data)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert f"X-Aamp-Egress-Rule: {rule}".encode() in answer
    [event] = await _settled(proxy, sink)
    assert (event.status, event.rule) == (status, rule)


async def test_lingering_is_bounded(sockdir, sink):
    """A client that keeps sending after its refusal is cut after linger_time."""
    limits = ProxyLimits(linger_time=0.5)
    rules = EgressRules.from_lists("block")
    async with EgressProxy(
        SANDBOX, sockdir / "l.sock", rules, EgressContext(StaticResolver(NAMES), sink), limits
    ) as proxy:
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        writer.write(
            b"POST http://b.test/ HTTP/1.1\r\nHost: b.test\r\nContent-Length: 99999999\r\n\r\n"
        )
        response = await read_response(reader)
        assert response.status == 403
        started = asyncio.get_running_loop().time()
        with contextlib.suppress(ConnectionError):
            while asyncio.get_running_loop().time() - started < 5:
                writer.write(b"x" * 4096)
                await writer.drain()
                await asyncio.sleep(0.01)
        elapsed = asyncio.get_running_loop().time() - started
        writer.close()
        assert elapsed < 3
        [event] = await _settled(proxy, sink)
    assert event.rule == "default: block"
