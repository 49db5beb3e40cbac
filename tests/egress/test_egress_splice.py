"""Large plain-HTTP bodies are spliced (splice.py), and nothing else about a request changes:
every request head on a kept-alive connection still goes through the parser, framing is kept
exactly, bytes are counted to the ledger and `max_bytes_out` still cuts at the byte."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from egress_client import read_response
from egress_upstream import UpstreamServer

from aamp.egress import splice
from aamp.egress.ledger import JsonLinesSink
from aamp.egress.proxy import EgressContext, EgressProxy
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules

pytestmark = pytest.mark.skipif(not splice.available(), reason="splice(2) is Linux-only")

SANDBOX = "sb-0000000000sp"
NAMES = {"a.test": ["127.0.0.10"]}
MiB = 1024 * 1024


@pytest.fixture
async def upstream():
    async with UpstreamServer("127.0.0.10") as server:
        yield server


@pytest.fixture
def sink(sockdir):
    return JsonLinesSink(sockdir / "ledger.jsonl")


def _proxy(sockdir, sink, **rules) -> EgressProxy:
    return EgressProxy(
        SANDBOX,
        sockdir / "egress.sock",
        EgressRules.from_lists("block", allow=["a.test"], **rules),
        EgressContext(StaticResolver(NAMES), sink),
    )


async def _trickle(writer: asyncio.StreamWriter, data: bytes, piece: int = 64 * 1024) -> None:
    """Send in pieces with pauses, so the body is not all buffered when the proxy reaches it
    (a body already in the proxy's buffer is copied, not spliced)."""
    for i in range(0, len(data), piece):
        writer.write(data[i : i + piece])
        await writer.drain()
        await asyncio.sleep(0.002)


def _chunked(data: bytes, size: int) -> bytes:
    out = b"".join(
        f"{len(data[i : i + size]):x}\r\n".encode() + data[i : i + size] + b"\r\n"
        for i in range(0, len(data), size)
    )
    return out + b"0\r\n\r\n"


async def test_kept_alive_connection_mixes_spliced_bodies_and_parsed_heads(sockdir, sink, upstream):
    base, host = f"http://a.test:{upstream.port}", f"a.test:{upstream.port}"
    upload = bytes(range(256)) * 4096  # 1 MiB, not one repeated byte
    async with _proxy(sockdir, sink) as proxy:
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        try:
            writer.write(f"GET {base}/bytes/{3 * MiB} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            response = await read_response(reader)
            assert response.status == 200 and response.body == b"x" * (3 * MiB)
            writer.write(
                f"GET {base}/bigchunked/{MiB + 5} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            )
            response = await read_response(reader)
            assert response.headers["transfer-encoding"] == "chunked"
            assert response.body == b"x" * (MiB + 5)
            head = f"POST {base}/echo HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(upload)}"
            writer.write(f"{head}\r\n\r\n".encode())
            await _trickle(writer, upload)
            response = await read_response(reader)
            assert response.body == upload
            writer.write(
                f"POST {base}/echo HTTP/1.1\r\nHost: {host}\r\n"
                "Transfer-Encoding: chunked\r\n\r\n".encode()
            )
            await _trickle(writer, _chunked(upload, 300_000))
            response = await read_response(reader)
            assert response.body == upload
            # The parser still judges the next head on this connection: smuggling is refused.
            writer.write(f"GET {base}/x HTTP/1.1\r\nHost: {host}\r\nHost: {host}\r\n\r\n".encode())
            refused = await read_response(reader)
            assert (refused.status, refused.rule) == (400, "client: duplicate host")
        finally:
            writer.close()
        assert upstream.connections == 1
        await proxy.flush()
        events = sink.read()
        stats = proxy.stats()
    assert [e.decision for e in events] == ["allowed"] * 4 + ["refused"]
    assert events[0].bytes_down > 3 * MiB and events[1].bytes_down > MiB + 5
    assert events[2].bytes_up > len(upload) and events[3].bytes_up > len(upload)
    assert stats.bytes_up == sum(e.bytes_up for e in events)
    assert stats.bytes_down == sum(e.bytes_down for e in events)


async def test_pipelined_request_behind_a_spliced_response(sockdir, sink, upstream):
    base, host = f"http://a.test:{upstream.port}", f"a.test:{upstream.port}"
    async with _proxy(sockdir, sink) as proxy:
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        try:
            writer.write(
                f"GET {base}/bytes/{2 * MiB} HTTP/1.1\r\nHost: {host}\r\n\r\n"
                f"GET {base}/after HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            )
            first = await read_response(reader)
            second = await read_response(reader)
        finally:
            writer.close()
    assert first.body == b"x" * (2 * MiB)
    assert second.body == f"hello from 127.0.0.10:{upstream.port} host={host}".encode()


async def test_body_until_close_is_spliced_whole(sockdir, sink, upstream):
    base, host = f"http://a.test:{upstream.port}", f"a.test:{upstream.port}"
    async with _proxy(sockdir, sink) as proxy:
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        try:
            writer.write(
                f"GET {base}/eofbytes/{2 * MiB + 3} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            )
            response = await read_response(reader)
        finally:
            writer.close()
        await proxy.flush()
        [event] = sink.read()
    assert response.headers["connection"] == "close"
    assert response.body == b"x" * (2 * MiB + 3)
    assert event.bytes_down > 2 * MiB + 3


async def test_max_bytes_out_cuts_a_spliced_upload_at_the_byte(sockdir, sink, upstream):
    base, host = f"http://a.test:{upstream.port}", f"a.test:{upstream.port}"
    cap = 200_000
    async with _proxy(sockdir, sink, max_bytes_out=cap) as proxy:
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        head = f"POST {base}/echo HTTP/1.1\r\nHost: {host}\r\nContent-Length: {MiB}\r\n\r\n"
        rest = b""
        try:
            writer.write(head.encode())
            with contextlib.suppress(ConnectionError):  # the proxy cuts mid-upload
                await _trickle(writer, b"q" * MiB)
            async with asyncio.timeout(5):
                with contextlib.suppress(ConnectionError):
                    rest = await reader.read()
        finally:
            writer.close()
        assert b"q" not in rest  # nothing was echoed
        assert proxy.stats().bytes_up == cap
        await proxy.flush()
        [event] = sink.read()
    assert (event.decision, event.rule, event.bytes_up) == ("cut", "egress.max_bytes_out", cap)
