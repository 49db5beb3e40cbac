"""The adversarial scenario: runs ONLY inside a test-made network namespace (egress_netns).

Fake "outside" hosts listen on addresses added to the namespace's loopback. A proxy with the
rules below is attacked with raw bytes over its Unix socket; after each attempt we record the
answer, the ledger events it produced, and which fake hosts saw a connection meanwhile.
A few positive controls prove the fake hosts are reachable, so a refusal means the proxy
refused, not that nothing was listening.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
from egress_client import exchange, read_response
from egress_upstream import UpstreamServer

from aamp.egress.ledger import JsonLinesSink
from aamp.egress.proxy import EgressContext, EgressProxy, ProxyLimits
from aamp.egress.resolver import DnsServerResolver, StaticResolver
from aamp.egress.rules import EgressRules

FAKE_HOSTS = [
    "127.0.0.10",
    "127.0.0.1",
    "127.0.0.2",
    "169.254.169.254",
    "1.1.1.1",
    "10.0.0.5",
    "100.100.100.200",
    "fd00:ec2::254",
    "::1",
]
NETNS_ADDRESSES = ["169.254.169.254", "1.1.1.1", "10.0.0.5", "100.100.100.200", "fd00:ec2::254"]

BLOCK_RULES = EgressRules.from_lists(
    "block",
    allow=["a.test", "*.corp.test:443", "files.test:8080", "*.wild.test"],
    deny=["*.pastebin.test", "*.bücher.test"],
)
ALLOW_RULES = EgressRules.from_lists("allow", deny=["*.pastebin.test"])
NAMES = {
    "a.test": ["127.0.0.10"],
    "localhost": ["127.0.0.1"],
    "x.pastebin.test": ["1.1.1.1"],
    "pastebin.test": ["1.1.1.1"],
    "www.bücher.test": ["1.1.1.1"],
    "x.corp.test": ["1.1.1.1"],
    "files.test": ["1.1.1.1"],
    "pub.wild.test": ["1.1.1.1"],
    "mixed.wild.test": ["10.0.0.5", "1.1.1.1"],
    "rebind.wild.test": ["10.0.0.5"],
    "meta.wild.test": ["169.254.169.254"],
    "mapped.wild.test": ["::ffff:169.254.169.254"],
    "v6meta.wild.test": ["fd00:ec2::254"],
    "cgnat.wild.test": ["100.100.100.200"],
    "metadata.google.internal": ["169.254.169.254"],
    "internal.test": ["10.0.0.5"],
}


def _get(url: str, host: str | None = None, extra: str = "") -> bytes:
    authority = url.split("/", 3)[2]
    return f"GET {url} HTTP/1.1\r\nHost: {host or authority}\r\n{extra}\r\n".encode("latin-1")


def _connect(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode("latin-1")


# (name, rules phase, request bytes, expected status, expected rule (prefix))
ATTACKS: list[tuple[str, str, bytes, int, str]] = [
    ("direct-ip-http", "block", _get("http://1.1.1.1/"), 403, "ip-literal"),
    ("direct-ip-connect", "block", _connect("1.1.1.1:443"), 403, "ip-literal"),
    ("direct-ip-under-default-allow", "allow", _get("http://1.1.1.1/"), 403, "ip-literal"),
    ("decimal-ip", "block", _get("http://16843009/"), 403, "ip-literal"),
    ("hex-ip", "block", _get("http://0x01010101/"), 403, "ip-literal"),
    ("octal-ip", "block", _get("http://01.01.01.01/"), 403, "ip-literal"),
    ("octal-loopback", "allow", _get("http://0177.0.0.1/"), 403, "ip-literal"),
    ("short-loopback", "allow", _get("http://127.1/"), 403, "ip-literal"),
    ("hex-short-loopback-connect", "allow", _connect("0x7f.1:80"), 403, "ip-literal"),
    ("decimal-loopback", "allow", _get("http://2130706433/"), 403, "ip-literal"),
    ("ipv6-loopback", "allow", _get("http://[::1]/"), 403, "ip-literal"),
    (
        "ipv4-mapped-metadata",
        "allow",
        _get("http://[::ffff:169.254.169.254]/"),
        403,
        "ip-literal",
    ),
    ("ipv4-mapped-hex-connect", "allow", _connect("[::ffff:a9fe:a9fe]:80"), 403, "ip-literal"),
    ("ipv6-metadata-literal", "allow", _get("http://[fd00:ec2::254]/"), 403, "ip-literal"),
    ("localhost-default-block", "block", _get("http://localhost/"), 403, "default: block"),
    ("localhost-default-allow", "allow", _get("http://localhost/"), 403, "address: loopback"),
    ("loopback-127.0.0.2", "allow", _get("http://127.0.0.2/"), 403, "ip-literal"),
    ("metadata-ip", "allow", _get("http://169.254.169.254/latest/meta-data/"), 403, "ip-literal"),
    (
        "metadata-name",
        "allow",
        _get("http://metadata.google.internal/computeMetadata/v1/"),
        403,
        "address: metadata",
    ),
    ("metadata-via-wildcard", "block", _get("http://meta.wild.test/"), 403, "address: metadata"),
    ("metadata-v6-name", "block", _get("http://v6meta.wild.test/"), 403, "address: metadata"),
    ("metadata-mapped-aaaa", "block", _get("http://mapped.wild.test/"), 403, "address: metadata"),
    ("alibaba-metadata-name", "block", _get("http://cgnat.wild.test/"), 403, "address: metadata"),
    (
        "name-resolving-private",
        "block",
        _connect("rebind.wild.test:443"),
        403,
        "address: private",
    ),
    (
        "private-under-default-allow",
        "allow",
        _get("http://internal.test/"),
        403,
        "address: private",
    ),
    ("connect-allowed-host-wrong-port", "block", _connect("x.corp.test:80"), 403, "default: block"),
    ("connect-port-pinned-rule", "block", _connect("files.test:443"), 403, "default: block"),
    (
        "absolute-uri-vs-host",
        "block",
        _get("http://a.test/", host="1.1.1.1"),
        400,
        "client: host mismatch",
    ),
    (
        "absolute-uri-vs-host-port",
        "block",
        _get("http://a.test/", host="a.test:8080"),
        400,
        "client: host mismatch",
    ),
    ("trailing-dot-denied", "allow", _get("http://x.pastebin.test./"), 403, "deny[0]"),
    ("uppercase-denied", "allow", _get("http://X.PASTEBIN.TEST/"), 403, "deny[0]"),
    ("mixed-case-trailing-dot", "allow", _connect("X.PasteBin.Test.:443"), 403, "deny[0]"),
    ("apex-of-denied-wildcard", "allow", _get("http://pastebin.test/"), 403, "deny[0]"),
    ("punycode-denied", "block", _get("http://www.XN--BCHER-KVA.test/"), 403, "deny[1]"),
    ("invalid-punycode", "allow", _get("http://xn--pastebin-.test/"), 400, "client: bad target"),
    (
        "utf8-in-target",
        "allow",
        "GET http://x。pastebin。test/ HTTP/1.1\r\n\r\n".encode(),
        400,
        "client: malformed",
    ),
    (
        "percent-encoded-host",
        "block",
        _get("http://a%2etest/", host="a.test"),
        400,
        "client: bad target",
    ),
    (
        "userinfo-trick",
        "block",
        _get("http://a.test@1.1.1.1/", host="1.1.1.1"),
        400,
        "client: bad target",
    ),
    (
        "duplicate-host",
        "block",
        _get("http://a.test/", extra="Host: 1.1.1.1\r\n"),
        400,
        "client: duplicate host",
    ),
    (
        "crlf-in-target",
        "block",
        b"GET http://a.test/\rHost: 1.1.1.1 HTTP/1.1\r\nHost: a.test\r\n\r\n",
        400,
        "client: malformed",
    ),
    (
        "nul-in-target",
        "block",
        b"GET http://a.test\x00.1.1.1.1/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        400,
        "client: malformed",
    ),
    (
        "space-in-host",
        "block",
        b"GET http://a.test 1.1.1.1/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        400,
        "client: malformed",
    ),
    ("ipv6-zone-id", "allow", _get("http://[fe80::1%25lo]/"), 400, "client: bad target"),
    ("https-absolute-without-connect", "block", _get("https://a.test/"), 400, "client: bad target"),
    (
        "origin-form-request",
        "block",
        b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
        400,
        "client: bad target",
    ),
    ("connect-port-zero", "block", _connect("a.test:0"), 400, "client: bad target"),
    ("connect-port-too-big", "block", _connect("a.test:65536"), 400, "client: bad target"),
    ("connect-port-signed", "block", _connect("a.test:+80"), 400, "client: bad target"),
    ("connect-no-port", "block", _connect("a.test"), 400, "client: bad target"),
    (
        "obs-fold-header",
        "block",
        b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-A: b\r\n c\r\n\r\n",
        400,
        "client: malformed",
    ),
    (
        "smuggling-te-and-cl",
        "block",
        b"POST http://a.test/echo HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
        "client: malformed",
    ),
    (
        "oversized-request-line",
        "block",
        _get("http://a.test/" + "a" * 10_000),
        414,
        "client: request line too long",
    ),
    (
        "oversized-headers",
        "block",
        _get("http://a.test/", extra="".join(f"X-Pad-{i}: {'p' * 1000}\r\n" for i in range(40))),
        431,
        "client: header too large",
    ),
    (
        "too-many-headers",
        "block",
        _get("http://a.test/", extra="".join(f"X-N-{i}: 1\r\n" for i in range(150))),
        431,
        "client: too many headers",
    ),
]


class FlippingDns:
    """A real UDP DNS server: `flip.wild.test` answers 1.1.1.1 the first time, then 10.0.0.5."""

    def __init__(self) -> None:
        self.queries: list[tuple[str, str]] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        query = dns.message.from_wire(data)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True)
        kind = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, kind))
        response = dns.message.make_response(query)
        if name == "flip.wild.test" and kind == "A":
            served = sum(1 for q in self.queries if q == (name, "A"))
            address = "1.1.1.1" if served == 1 else "10.0.0.5"
            response.answer.append(dns.rrset.from_text(name + ".", 0, "IN", "A", address))
        elif name != "flip.wild.test":
            response.set_rcode(dns.rcode.NXDOMAIN)
        self.transport.sendto(response.to_wire(), addr)

    def error_received(self, exc) -> None:  # pragma: no cover - UDP noise
        pass

    def connection_lost(self, exc) -> None:
        pass


async def _slowloris(sock: Path) -> dict:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    try:
        for byte in b"GET http://a.test/ HTTP/1.1\r\nHost: a.te":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)
            if reader.at_eof() or len(reader._buffer):  # the proxy answered already
                break
        async with asyncio.timeout(10):
            response = await read_response(reader)
        return {"status": response.status, "rule": response.rule, "body": response.body.decode()}
    finally:
        writer.close()


async def _keepalive_recheck(sock: Path) -> dict:
    """Request 1 to a.test (allowed) then request 2 to 1.1.1.1 on the same connection."""
    reader, writer = await asyncio.open_unix_connection(str(sock))
    try:
        writer.write(_get("http://a.test/"))
        await writer.drain()
        first = await read_response(reader)
        writer.write(_get("http://pub.wild.test/", extra="").replace(b"pub.wild.test", b"1.1.1.1"))
        await writer.drain()
        second = await read_response(reader)
        return {
            "status": second.status,
            "rule": second.rule,
            "body": second.body.decode(),
            "first_status": first.status,
        }
    finally:
        writer.close()


async def run(args: dict) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="aamp-ns-", dir="/tmp"))
    servers: dict[str, list[UpstreamServer]] = {}
    for host in FAKE_HOSTS:
        servers[host] = [await UpstreamServer(host, 80).start()]
        if host in ("1.1.1.1", "10.0.0.5"):
            servers[host].append(await UpstreamServer(host, 443).start())
    servers["1.1.1.1"].append(await UpstreamServer("1.1.1.1", 8080).start())

    def hits() -> dict[str, int]:
        return {h: sum(s.connections for s in group) for h, group in servers.items()}

    sink = JsonLinesSink(workdir / "ledger.jsonl")
    limits = ProxyLimits(header_timeout=1.0)
    proxy = EgressProxy(
        "sb-0000000000aa",
        workdir / "p.sock",
        BLOCK_RULES,
        EgressContext(StaticResolver(NAMES), sink),
        limits,
    )
    await proxy.start()
    results: dict[str, dict] = {}

    async def attempt(name: str, phase: str, run_it) -> None:
        proxy.update_rules(BLOCK_RULES if phase == "block" else ALLOW_RULES)
        before_hits = hits()
        before_events = len(sink.read())
        outcome = await run_it()
        await asyncio.sleep(0.02)  # let the proxy finish its side of the connection
        await proxy.flush()
        after_hits = hits()
        outcome["events"] = [json.loads(e.to_json()) for e in sink.read()[before_events:]]
        outcome["hits"] = {h: after_hits[h] - before_hits[h] for h in after_hits}
        results[name] = outcome

    for name, phase, data, _status, _rule in ATTACKS:
        await attempt(name, phase, lambda data=data: exchange(proxy.socket_path, data))
    await attempt("slowloris", "block", lambda: _slowloris(proxy.socket_path))
    await attempt("keepalive-recheck", "block", lambda: _keepalive_recheck(proxy.socket_path))

    # Positive controls: the fake outside is reachable when a rule says so.
    controls = {
        "allowed-name": ("block", _get("http://a.test/")),
        "wildcard-public": ("block", _get("http://pub.wild.test/")),
        "wildcard-connect-public": ("block", _connect("pub.wild.test:443")),
        "mixed-answer-uses-public": ("block", _get("http://mixed.wild.test/")),
        "port-pinned-rule": ("block", _connect("files.test:8080")),
    }
    for name, (phase, data) in controls.items():
        await attempt(name, phase, lambda data=data: exchange(proxy.socket_path, data))

    # Live rule change: naming the exact IP (even a private one) allows it, for new connections.
    exact = EgressRules.from_lists("block", allow=["1.1.1.1", "10.0.0.5:80"])
    proxy.update_rules(exact)
    before = hits()
    results["rule-change-exact-ip"] = await exchange(proxy.socket_path, _get("http://1.1.1.1/"))
    results["rule-change-exact-private-ip"] = await exchange(
        proxy.socket_path, _get("http://10.0.0.5/")
    )
    results["rule-change-hits"] = {h: n - before[h] for h, n in hits().items()}
    await proxy.close()

    # Resolve once, connect to the checked address: a DNS server that flips its answer.
    dns_server = FlippingDns()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: dns_server, local_addr=("127.0.0.53", 53)
    )
    dns_sink = JsonLinesSink(workdir / "dns-ledger.jsonl")
    dns_proxy = EgressProxy(
        "sb-0000000000bb",
        workdir / "d.sock",
        BLOCK_RULES,
        EgressContext(DnsServerResolver(["127.0.0.53"], timeout=2.0), dns_sink),
    )
    async with dns_proxy:
        before = hits()
        first = await exchange(dns_proxy.socket_path, _get("http://flip.wild.test/"))
        second = await exchange(dns_proxy.socket_path, _get("http://flip.wild.test/"))
        third = await exchange(dns_proxy.socket_path, _get("http://nope.wild.test/"))
        dns_hits = {h: n - before[h] for h, n in hits().items()}
    transport.close()
    results["dns"] = {
        "first": first,
        "second": second,
        "unknown": third,
        "hits": dns_hits,
        "queries": dns_server.queries,
        "events": [json.loads(e.to_json()) for e in dns_sink.read()],
    }
    for group in servers.values():
        for server in group:
            await server.close()
    return results
