from __future__ import annotations

import asyncio
import ipaddress

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from aamp.egress.resolver import DnsServerResolver, ResolveError, StaticResolver, SystemResolver

ip = ipaddress.ip_address


async def test_static_resolver_uses_canonical_names():
    resolver = StaticResolver({"A.Test.": ["127.0.0.10", "::1"], "bücher.test": ["127.0.0.11"]})
    assert await resolver.resolve("a.test") == [ip("127.0.0.10"), ip("::1")]
    assert await resolver.resolve("xn--bcher-kva.test") == [ip("127.0.0.11")]
    with pytest.raises(ResolveError):
        await resolver.resolve("b.test")


@pytest.mark.parametrize(
    "mapping", [{"1.2.3.4": ["127.0.0.1"]}, {"a.test": []}, {"a test": ["127.0.0.1"]}]
)
def test_static_resolver_refuses_bad_maps(mapping):
    with pytest.raises(ValueError):
        StaticResolver(mapping)


async def test_system_resolver_resolves_localhost_from_the_hosts_file():
    addresses = await SystemResolver(timeout=5).resolve("localhost")
    assert addresses and all(a.is_loopback for a in addresses)


class _DnsServerForTests(asyncio.DatagramProtocol):
    """A real UDP DNS server on loopback answering from a table; `silent` never answers."""

    def __init__(self, table: dict[tuple[str, str], list[str]], silent: bool = False):
        self.table = table
        self.silent = silent
        self.queries: list[tuple[str, str]] = []

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        query = dns.message.from_wire(data)
        question = query.question[0]
        key = (question.name.to_text(omit_final_dot=True), dns.rdatatype.to_text(question.rdtype))
        self.queries.append(key)
        if self.silent:
            return
        response = dns.message.make_response(query)
        if not any(name == key[0] for name, _ in self.table):
            response.set_rcode(dns.rcode.NXDOMAIN)
        for value in self.table.get(key, []):
            response.answer.append(dns.rrset.from_text(key[0] + ".", 0, "IN", key[1], value))
        self.transport.sendto(response.to_wire(), addr)


async def _serve(protocol):
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: protocol, local_addr=("127.0.0.20", 0)
    )
    return transport, transport.get_extra_info("sockname")[1]


async def test_dns_server_resolver_asks_the_given_server_for_a_and_aaaa():
    server = _DnsServerForTests(
        {("a.test", "A"): ["127.0.0.10", "127.0.0.12"], ("a.test", "AAAA"): ["fd00::1"]}
    )
    transport, port = await _serve(server)
    try:
        resolver = DnsServerResolver(["127.0.0.20"], port=port, timeout=2)
        assert await resolver.resolve("a.test") == [
            ip("127.0.0.10"),
            ip("127.0.0.12"),
            ip("fd00::1"),
        ]
        assert sorted(server.queries) == [("a.test", "A"), ("a.test", "AAAA")]
        with pytest.raises(ResolveError) as info:
            await resolver.resolve("missing.test")
        assert not info.value.timeout
    finally:
        transport.close()


async def test_dns_server_resolver_times_out():
    transport, port = await _serve(_DnsServerForTests({}, silent=True))
    try:
        with pytest.raises(ResolveError) as info:
            await DnsServerResolver(["127.0.0.20"], port=port, timeout=0.3).resolve("a.test")
        assert info.value.timeout
    finally:
        transport.close()


def test_dns_server_resolver_needs_addresses():
    with pytest.raises(ValueError):
        DnsServerResolver([])
    with pytest.raises(ValueError):
        DnsServerResolver(["dns.example"])
