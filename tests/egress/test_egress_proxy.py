"""The proxy against real loopback upstreams (127.0.0.10/11), raw clients on its Unix socket."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest
from egress_client import connect, get, read_response, send
from egress_upstream import UpstreamServer, ws_frame, ws_read_frame

from aamp.egress.ledger import JsonLinesSink
from aamp.egress.proxy import EgressContext, EgressProxy, ProxyLimits
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules

SANDBOX = "sb-00000000000a"
NAMES = {"a.test": ["127.0.0.10"], "b.test": ["127.0.0.11"], "c.test": ["127.0.0.10"]}


@pytest.fixture
async def upstream():
    async with UpstreamServer("127.0.0.10") as server:
        yield server


@pytest.fixture
async def upstream_b():
    async with UpstreamServer("127.0.0.11") as server:
        yield server


@pytest.fixture
def sink(sockdir):
    return JsonLinesSink(sockdir / "ledger.jsonl")


@pytest.fixture
async def proxy(sockdir, sink):
    rules = EgressRules.from_lists("block", allow=["a.test"], deny=["*.pastebin.test"])
    p = EgressProxy(
        SANDBOX,
        sockdir / "egress.sock",
        rules,
        EgressContext(StaticResolver(NAMES), sink),
        ProxyLimits(),
    )
    await p.start()
    yield p
    await p.close()


async def events(proxy, sink):
    await proxy.flush()
    return sink.read()


async def test_plain_http_allowed_and_recorded(proxy, sink, upstream):
    response = await get(proxy.socket_path, f"http://a.test:{upstream.port}/hello")
    assert response.status == 200
    assert (
        response.body
        == f"hello from 127.0.0.10:{upstream.port} host=a.test:{upstream.port}".encode()
    )
    assert upstream.requests == [("GET", "/hello", f"a.test:{upstream.port}")]
    [event] = await events(proxy, sink)
    assert event.sandbox_id == SANDBOX
    assert (event.kind, event.host, event.port, event.address) == (
        "http",
        "a.test",
        upstream.port,
        "127.0.0.10",
    )
    assert (event.decision, event.rule, event.status) == ("allowed", "allow[0] a.test", 200)
    assert event.bytes_up > 0 and event.bytes_down > len(response.body)
    assert event.duration >= 0
    stats = proxy.stats()
    assert (stats.bytes_up, stats.bytes_down) == (event.bytes_up, event.bytes_down)


async def test_refusal_names_the_rule(proxy, sink, upstream_b):
    response = await get(proxy.socket_path, f"http://b.test:{upstream_b.port}/")
    assert response.status == 403
    assert response.rule == "default: block"
    assert b"rule: default: block" in response.body
    assert upstream_b.connections == 0
    [event] = await events(proxy, sink)
    assert (event.decision, event.rule, event.address) == ("refused", "default: block", None)


async def test_keep_alive_reuses_upstream_and_rechecks_each_request(proxy, sink, upstream):
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    try:
        for i in range(3):
            writer.write(
                f"GET http://a.test:{upstream.port}/n{i} HTTP/1.1\r\nHost: a.test:{upstream.port}"
                "\r\n\r\n".encode()
            )
            response = await read_response(reader)
            assert response.status == 200 and "connection" not in response.headers
        assert upstream.connections == 1  # the kept-alive upstream connection was reused
        proxy.update_rules(EgressRules.from_lists("block", allow=["c.test"]))
        writer.write(
            f"GET http://a.test:{upstream.port}/n3 HTTP/1.1\r\nHost: a.test\r\n\r\n".encode()
        )
        # Host without port vs URI with port: refused before any rule, as a mismatch
        refused = await read_response(reader)
        assert refused.status == 400
    finally:
        writer.close()
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    try:
        writer.write(
            f"GET http://c.test:{upstream.port}/ok HTTP/1.1\r\nHost: c.test:{upstream.port}\r\n\r\n"
            f"GET http://a.test:{upstream.port}/no HTTP/1.1\r\nHost: a.test:{upstream.port}"
            "\r\n\r\n".encode()
        )
        assert (await read_response(reader)).status == 200
        second = await read_response(reader)
        assert (second.status, second.rule) == (403, "default: block")
    finally:
        writer.close()
    recorded = [(e.decision, e.rule) for e in await events(proxy, sink)]
    assert recorded == [("allowed", "allow[0] a.test")] * 3 + [
        ("refused", "client: host mismatch"),
        ("allowed", "allow[0] c.test"),
        ("refused", "default: block"),
    ]


async def test_request_bodies_and_chunked_responses(proxy, upstream):
    base = f"http://a.test:{upstream.port}"
    body = b"z" * 70_000
    response = await send(
        proxy.socket_path,
        f"POST {base}/echo HTTP/1.1\r\nHost: a.test:{upstream.port}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )
    assert response.status == 200 and response.body == body
    chunked = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    response = await send(
        proxy.socket_path,
        f"POST {base}/echo HTTP/1.1\r\nHost: a.test:{upstream.port}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
        + chunked,
    )
    assert response.body == b"hello world"
    response = await get(proxy.socket_path, f"{base}/chunked/2500")
    assert response.headers["transfer-encoding"] == "chunked" and response.body == b"y" * 2500
    response = await get(proxy.socket_path, f"{base}/close")
    assert response.headers["connection"] == "close" and response.body == b"until-close"
    response = await get(proxy.socket_path, f"{base}/bytes/3000000")
    assert len(response.body) == 3_000_000


async def test_connect_tunnel_and_websocket(proxy, sink, upstream):
    response, reader, writer = await connect(proxy.socket_path, f"a.test:{upstream.port}")
    assert response.status == 200
    writer.write(
        b"GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    handshake = await read_response(reader)
    assert handshake.status == 101
    assert handshake.headers["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    for text in ("one", "two"):
        writer.write(ws_frame(text.encode(), mask=True))
        assert await ws_read_frame(reader) == f"echo: {text}"
    writer.close()
    await asyncio.sleep(0.05)
    [event] = await events(proxy, sink)
    assert (event.kind, event.decision, event.status) == ("connect", "allowed", 200)
    assert event.bytes_up > 150 and event.bytes_down > 150


async def test_rules_replaced_on_a_live_proxy_apply_to_new_connections(proxy, upstream):
    target = f"http://a.test:{upstream.port}/"
    assert (await get(proxy.socket_path, target)).status == 200
    proxy.update_rules(EgressRules.from_lists("allow", deny=["a.test"]))
    refused = await get(proxy.socket_path, target)
    assert (refused.status, refused.rule) == (403, "deny[0] a.test")
    proxy.update_rules(EgressRules.from_lists("block", allow=[f"a.test:{upstream.port}"]))
    assert (await get(proxy.socket_path, target)).status == 200
    with pytest.raises(TypeError):
        proxy.update_rules(["a.test"])  # type: ignore[arg-type]


async def test_max_bytes_out_cuts_the_connection(sockdir, sink, upstream):
    rules = EgressRules.from_lists("block", allow=["a.test"], max_bytes_out=10_000)
    async with EgressProxy(
        SANDBOX, sockdir / "cap.sock", rules, EgressContext(StaticResolver(NAMES), sink)
    ) as proxy:
        response, reader, writer = await connect(proxy.socket_path, f"a.test:{upstream.port}")
        assert response.status == 200
        body = b"q" * 50_000
        writer.write(
            f"POST /echo HTTP/1.1\r\nHost: a.test\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        async with asyncio.timeout(5):
            try:
                rest = await reader.read()  # the proxy cuts: EOF (or reset) without an echo
            except ConnectionResetError:
                rest = b""
        assert rest == b""
        writer.close()
        later = await get(proxy.socket_path, f"http://a.test:{upstream.port}/")
        assert (later.status, later.rule) == (403, "egress.max_bytes_out")
        assert proxy.stats().bytes_up == 10_000
        recorded = [(e.decision, e.rule, e.bytes_up) for e in await events(proxy, sink)]
    assert recorded == [
        ("cut", "egress.max_bytes_out", 10_000),
        ("refused", "egress.max_bytes_out", 0),
    ]


async def test_upstream_failures_are_502_and_504(sockdir, sink):
    silent = await asyncio.start_server(
        lambda r, w: None, "127.0.0.10", 0
    )  # accepts, never answers
    silent_port = silent.sockets[0].getsockname()[1]
    closed = await asyncio.start_server(lambda r, w: None, "127.0.0.10", 0)
    closed_port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    limits = ProxyLimits(response_timeout=0.5)
    rules = EgressRules.from_lists("block", allow=["a.test"])
    async with EgressProxy(
        SANDBOX, sockdir / "f.sock", rules, EgressContext(StaticResolver(NAMES), sink), limits
    ) as proxy:
        refused = await get(proxy.socket_path, f"http://a.test:{closed_port}/")
        assert (refused.status, refused.rule) == (502, "allow[0] a.test")
        slow = await get(proxy.socket_path, f"http://a.test:{silent_port}/")
        assert slow.status == 504
        recorded = [(e.decision, e.status) for e in await events(proxy, sink)]
    silent.close()
    assert recorded == [("allowed", 502), ("allowed", 504)]


async def test_socket_is_private_and_removed_on_close(sockdir, sink):
    proxy = EgressProxy(
        SANDBOX, sockdir / "m.sock", EgressRules(), EgressContext(StaticResolver(NAMES), sink)
    )
    await proxy.start()
    mode = os.stat(proxy.socket_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    await proxy.close()
    assert not proxy.socket_path.exists()


async def test_a_stale_socket_is_replaced_and_any_other_file_is_left_alone(sockdir, sink):
    def proxy() -> EgressProxy:
        context = EgressContext(StaticResolver(NAMES), sink)
        return EgressProxy(SANDBOX, sockdir / "m.sock", EgressRules(), context)

    stale = proxy()
    await stale.start()
    stale._server.close()  # type: ignore[union-attr]  # a crash leaves the file behind
    fresh = proxy()
    await fresh.start()
    assert stat.S_ISSOCK(os.stat(fresh.socket_path).st_mode)
    await fresh.close()
    await stale.close()

    fresh.socket_path.write_text("not a socket")
    with pytest.raises(ValueError, match="not a socket; refusing to replace it"):
        await proxy().start()
    await proxy().close()
    assert fresh.socket_path.read_text() == "not a socket"


async def test_close_records_an_open_tunnel(sockdir, sink, upstream):
    proxy = EgressProxy(
        SANDBOX,
        sockdir / "t.sock",
        EgressRules.from_lists(allow=["a.test"]),
        EgressContext(StaticResolver(NAMES), sink),
    )
    await proxy.start()
    response, _reader, writer = await connect(proxy.socket_path, f"a.test:{upstream.port}")
    assert response.status == 200
    await proxy.close()
    writer.close()
    [event] = sink.read()
    assert (event.kind, event.decision) == ("connect", "allowed")


async def _settle(proxy) -> None:
    """Let the proxy finish the connections the clients closed, and the ledger its writes."""
    for _ in range(250):
        if proxy.stats().open_connections == 0:
            break
        await asyncio.sleep(0.02)
    await proxy.flush()
    await asyncio.sleep(0.1)


def _open_fds() -> set[tuple[str, str]]:
    """(fd, what it points to) for every open descriptor of this process."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except FileNotFoundError:  # the descriptor listdir itself used
            continue
    return found


async def test_200_concurrent_connections_lose_no_event_and_leak_no_fd(
    sockdir, sink, upstream, upstream_b
):
    """200 connections at once spread over four sandboxes' proxies sharing one ledger:
    allowed, refused, tunnelled and malformed ones mixed."""
    rules = EgressRules.from_lists("block", allow=["a.test"])
    sandboxes = [f"sb-00000000000{k}" for k in range(4)]
    proxies = [
        EgressProxy(sb, sockdir / f"c{k}.sock", rules, EgressContext(StaticResolver(NAMES), sink))
        for k, sb in enumerate(sandboxes)
    ]
    for proxy in proxies:
        await proxy.start()
        await get(proxy.socket_path, f"http://a.test:{upstream.port}/warm")
        await _settle(proxy)
    before = _open_fds()

    async def one(i: int) -> int:
        path = proxies[i % 4].socket_path
        kind = (i // 4) % 4
        if kind == 0:
            return (await get(path, f"http://b.test:{upstream_b.port}/{i}")).status
        if kind == 1:
            response, reader, writer = await connect(path, f"a.test:{upstream.port}")
            writer.write(f"GET /bytes/{i} HTTP/1.1\r\nHost: a.test\r\n\r\n".encode())
            body = (await read_response(reader)).body
            writer.close()
            return response.status if len(body) == i else -1
        if kind == 2:
            return (await send(path, b"GARBAGE\r\n\r\n")).status
        return (await get(path, f"http://a.test:{upstream.port}/{i}")).status

    statuses = await asyncio.gather(*(one(i) for i in range(200)))
    assert sorted(set(statuses)) == [200, 400, 403]
    for proxy in proxies:
        await _settle(proxy)
    assert _open_fds() - before == set()  # nothing new is left open (sockets, pipes)
    recorded = sink.read()
    assert len(recorded) == 204  # 200 plus one warm-up per proxy
    for sb in sandboxes:
        mine = [e for e in recorded if e.sandbox_id == sb]
        assert len(mine) == 51
        assert len({e.connection for e in mine}) == 51
    assert sum(1 for e in recorded if e.decision == "refused") == 100
    for proxy in proxies:
        await proxy.close()


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://localhost/", "default: block"),
        ("http://app.localhost:8080/", "default: block"),
        ("http://127.0.0.1:9/", "ip-literal"),
        ("http://[::1]/", "ip-literal"),
    ],
)
async def test_a_refused_loopback_request_says_loopback_is_the_sandbox(proxy, sink, url, rule):
    """A guest program that sends localhost through the proxy anyway (its NO_PROXY sends it
    to the guest's own loopback) is told why no rule could ever let it through."""
    response = await get(proxy.socket_path, url)
    assert (response.status, response.rule) == (403, rule)
    assert b"loopback always means the sandbox itself" in response.body
    [event] = await events(proxy, sink)
    assert event.rule == rule and "the sandbox itself" in event.reason
