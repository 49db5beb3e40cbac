"""Name resolution on the host, configurable because air-gapped sites have their own DNS.

The proxy asks a resolver exactly once per upstream connection and connects to an address from
that one answer after checking it, so a name cannot be checked against one address and then
connected to another (DNS rebinding). The guest never resolves anything.

Three resolvers share one small contract, `Resolver.resolve(name) -> list of addresses`:

- `StaticResolver({"a.test": ["127.0.0.10"]})` — a fixed map (tests, or sites that pin names).
- `SystemResolver()` — the host's own resolver through `loop.getaddrinfo`.
- `DnsServerResolver("10.1.2.3", port=53)` — asks the given DNS server(s) directly (dnspython),
  A and AAAA, without reading the host's resolv.conf.

Names handed in are already canonical (`aamp.policy.hosts.normalize_host`); IP literals never
reach a resolver.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

import dns.asyncresolver
import dns.exception
import dns.rdatatype
import dns.resolver

if TYPE_CHECKING:
    from aamp.config import Settings

from aamp.policy.addresses import IPAddress
from aamp.policy.hosts import HostError, normalize_host


class ResolveError(Exception):
    """The name has no usable address; `timeout` says whether the resolver ran out of time."""

    def __init__(self, message: str, *, timeout: bool = False):
        super().__init__(message)
        self.timeout = timeout


class Resolver(Protocol):
    async def resolve(self, name: str) -> list[IPAddress]:
        """All addresses for `name`, in the resolver's order; raises `ResolveError`."""
        ...


def _dedupe(addresses: Iterable[IPAddress]) -> list[IPAddress]:
    seen: dict[IPAddress, None] = {}
    for address in addresses:
        seen.setdefault(address, None)
    return list(seen)


class StaticResolver:
    """A fixed name → addresses map; names are normalised the same way requests are."""

    def __init__(self, mapping: Mapping[str, Iterable[str]]):
        table: dict[str, list[IPAddress]] = {}
        for name, addresses in mapping.items():
            try:
                host = normalize_host(name)
            except HostError as exc:
                raise ValueError(f"static resolver: bad name {name!r}: {exc}") from None
            if host.ip is not None:
                raise ValueError(f"static resolver: {name!r} is an address, not a name")
            parsed = [ipaddress.ip_address(a) for a in addresses]
            if not parsed:
                raise ValueError(f"static resolver: {name!r} has no addresses")
            table[host.name] = parsed
        self._table = table

    async def resolve(self, name: str) -> list[IPAddress]:
        found = self._table.get(name)
        if not found:
            raise ResolveError(f"{name} is not in the static resolver's map")
        return list(found)


class SystemResolver:
    """The host's resolver (`getaddrinfo`), bounded by `timeout` seconds."""

    def __init__(self, timeout: float = 5.0):
        self._timeout = timeout

    async def resolve(self, name: str) -> list[IPAddress]:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout):
                infos = await loop.getaddrinfo(
                    name, None, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
                )
        except TimeoutError:
            raise ResolveError(f"resolving {name} timed out", timeout=True) from None
        except OSError as exc:
            raise ResolveError(f"cannot resolve {name}: {exc}") from None
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
        if not addresses:
            raise ResolveError(f"{name} has no addresses")
        return _dedupe(addresses)


class DnsServerResolver:
    """Ask the given DNS server(s) for A and AAAA records, ignoring the host's configuration."""

    def __init__(self, servers: Iterable[str], *, port: int = 53, timeout: float = 5.0):
        nameservers = [str(ipaddress.ip_address(s)) for s in servers]
        if not nameservers:
            raise ValueError("DnsServerResolver needs at least one server address")
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = nameservers
        resolver.port = port
        resolver.lifetime = timeout
        resolver.timeout = timeout
        resolver.cache = None  # one answer per connection; no stale answers across them
        self._resolver = resolver
        self._timeout = timeout

    async def _query(self, name: str, rdtype: dns.rdatatype.RdataType) -> list[IPAddress]:
        try:
            answer = await self._resolver.resolve(name, rdtype, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        return [ipaddress.ip_address(record.address) for record in answer]

    async def resolve(self, name: str) -> list[IPAddress]:
        try:
            v4, v6 = await asyncio.gather(
                self._query(name, dns.rdatatype.A), self._query(name, dns.rdatatype.AAAA)
            )
        except dns.exception.Timeout:
            raise ResolveError(f"resolving {name} timed out", timeout=True) from None
        except dns.exception.DNSException as exc:
            raise ResolveError(f"cannot resolve {name}: {exc}") from None
        addresses = _dedupe([*v4, *v6])
        if not addresses:
            raise ResolveError(f"{name} has no A or AAAA records")
        return addresses


def egress_resolver(settings: Settings) -> Resolver:
    """Names are resolved on the host: by this host's resolver, or by the DNS servers in
    AAMP_EGRESS_DNS (comma-separated addresses), as air-gapped sites often need. The sandbox
    manager holds it (`manager.resolver`); the egress proxies and runs' model-endpoint
    connections both resolve with it."""
    servers = [s.strip() for s in settings.env.get("AAMP_EGRESS_DNS", "").split(",") if s.strip()]
    return DnsServerResolver(servers) if servers else SystemResolver()
