"""The host's own connections to a URL an admin registered (a model endpoint): which addresses
they may reach, and an httpx transport that resolves once, checks, and connects to the address
it checked.

The guest's traffic goes through the egress proxy; these connections are the host process's,
made on behalf of a run, so they must not become a way around the proxy's address checks. The
same address classes (`aamp.policy.addresses.classify`) decide, read for a URL an admin typed:

- a URL whose host is an IP literal reaches exactly that address, whatever its class (the
  admin named it: an on-prem server at 10.0.0.5, a test server at 127.0.0.1);
- a host *name* reaches public addresses and — because the admin registered that exact name,
  which is audited with the classes it resolved to — loopback, private, CGNAT and
  unique-local ones (on-prem model servers usually are private);
- link-local, metadata, multicast, unspecified, broadcast and reserved addresses are reached
  only when the URL names that IP literally; a name resolving to one is refused.

`CheckedTransport(url, resolver)` is the httpx transport for one such URL. Its connections go
through `_CheckedBackend` (httpcore's network-backend seam): the host must be the URL's host
and the port its port (a redirect elsewhere, or anything else, is refused), the name is
resolved once with the installation's resolver, every address is checked, and the connection
goes to the first checked address that answers — never to a second lookup. TLS still verifies
the certificate for the URL's name (against SSL_CERT_FILE/SSL_CERT_DIR when set, else the
bundled CAs). Proxy variables of the host's environment are ignored.
Each connection attempt is reported to `on_connect` (allowed or refused, with the address and
its class) so the caller can audit it.
"""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore
import httpx

from aamp.egress.resolver import ResolveError, Resolver
from aamp.policy.addresses import AddressKind, IPAddress, classify
from aamp.policy.hosts import Host, HostError, normalize_host

# What a registered host *name* may resolve to; anything else only by its IP literal.
NAME_REACHES = frozenset(
    {
        AddressKind.PUBLIC,
        AddressKind.LOOPBACK,
        AddressKind.PRIVATE,
        AddressKind.CGNAT,
        AddressKind.ULA,
    }
)


class UrlError(ValueError):
    """A URL that cannot be registered; the message says why."""


class ConnectionRefused(Exception):
    """The host refused to connect (wrong host or port, an address a name may not reach, no
    address at all); the message names the URL's owner, the address and its class."""


@dataclass(frozen=True)
class RegisteredUrl:
    """A registered URL in canonical form: http(s), a canonical host, an explicit port."""

    url: str
    scheme: str
    host: Host
    port: int

    @classmethod
    def parse(cls, text: object) -> RegisteredUrl:
        if not isinstance(text, str) or not 1 <= len(text) <= 512:
            raise UrlError("expected an http(s) URL such as http://llm.internal:8080/v1")
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UrlError(f"expected an http(s) URL such as http://host:8080/v1, got {text!r}")
        if "@" in parts.netloc or parts.query or parts.fragment:
            raise UrlError("the URL may not carry credentials, a query or a fragment")
        try:
            port = parts.port
        except ValueError:
            raise UrlError("the port is not a number between 1 and 65535") from None
        raw_host = parts.netloc.rsplit(":", 1)[0] if port is not None else parts.netloc
        try:
            host = normalize_host(raw_host)
        except HostError as exc:
            raise UrlError(f"host: {exc}") from None
        if host.ip is not None and host.ip.version == 4 and raw_host.rstrip(".") != host.name:
            raise UrlError(f"write the address as {host.name}, not {raw_host!r}")
        if port == 0:
            raise UrlError("the port is not a number between 1 and 65535")
        port = port or (443 if parts.scheme == "https" else 80)
        path = parts.path.rstrip("/")
        return cls(f"{parts.scheme}://{host}:{port}{path}", parts.scheme, host, port)


@dataclass(frozen=True)
class AddressVerdict:
    address: IPAddress
    kind: AddressKind
    allowed: bool
    reason: str


def check_address(owner: str, url: RegisteredUrl, address: IPAddress) -> AddressVerdict:
    """May the host connect to `address` for `url` (registered as `owner`)? See the module
    docstring for the rule."""
    verdict = classify(address)
    if url.host.ip is not None:
        allowed = address == url.host.ip
        reason = (
            f"{owner}: {url.host} is named exactly"
            if allowed
            else f"{owner}: {address} is not {url.host}, the address the URL names"
        )
        return AddressVerdict(address, verdict.kind, allowed, reason)
    if verdict.kind in NAME_REACHES:
        reason = f"{owner}: {url.host.name} resolved to {verdict.describe()}"
        return AddressVerdict(address, verdict.kind, True, reason)
    return AddressVerdict(
        address,
        verdict.kind,
        False,
        f"{owner}: {url.host.name} resolved to {verdict.describe()}; a host name reaches only "
        f"public, loopback, private, CGNAT and unique-local addresses — register the URL with "
        f"the IP address itself if that place is meant",
    )


async def resolve_and_check(
    owner: str, url: RegisteredUrl, resolver: Resolver
) -> list[AddressVerdict]:
    """Resolve the URL's host once (an IP literal is not resolved) and judge every address."""
    if url.host.ip is not None:
        found: list[IPAddress] = [url.host.ip]
    else:
        try:
            found = await resolver.resolve(url.host.name)
        except ResolveError as exc:
            raise ConnectionRefused(f"{owner}: {exc}") from None
    return [check_address(owner, url, address) for address in found]


# Told every connection attempt: all the verdicts, and the address connected to (None: refused).
OnConnect = Callable[[list[AddressVerdict], AddressVerdict | None], Awaitable[None]]


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    def __init__(
        self, owner: str, url: RegisteredUrl, resolver: Resolver, on_connect: OnConnect | None
    ) -> None:
        self._owner, self._url, self._resolver = owner, url, resolver
        self._on_connect = on_connect
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            asked = normalize_host(f"[{host}]" if ":" in host else host)
        except HostError as exc:
            raise ConnectionRefused(f"{self._owner}: {exc}") from None
        if asked != self._url.host or port != self._url.port:
            raise ConnectionRefused(
                f"{self._owner} connects only to {self._url.host}:{self._url.port}, "
                f"not {asked}:{port}"
            )
        verdicts = await resolve_and_check(self._owner, self._url, self._resolver)
        passed = [v for v in verdicts if v.allowed]
        if not passed:
            if self._on_connect is not None:
                await self._on_connect(verdicts, None)
            raise ConnectionRefused(next(v.reason for v in verdicts if not v.allowed))
        last: Exception | None = None
        for verdict in passed:
            try:
                stream = await self._inner.connect_tcp(
                    str(verdict.address),
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
                continue
            if self._on_connect is not None:
                await self._on_connect(verdicts, verdict)
            return stream
        assert last is not None
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise ConnectionRefused(f"{self._owner} connects over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class CheckedTransport(httpx.AsyncHTTPTransport):
    """The httpx transport for one registered URL (see the module docstring). Use it with
    `follow_redirects=False` on the client: a redirect elsewhere would be refused anyway."""

    def __init__(
        self,
        owner: str,
        url: RegisteredUrl,
        resolver: Resolver,
        *,
        on_connect: OnConnect | None = None,
    ) -> None:
        super().__init__(trust_env=False)
        # httpx builds its httpcore pool without a way to pass a network backend; replace the
        # pool with the same one on the checked backend (httpx 0.28's `_pool`, pinned). The
        # TLS context still honours SSL_CERT_FILE / SSL_CERT_DIR (a site's own CA); proxy
        # variables are never read, so no connection is sent anywhere but the checked address.
        ssl_context = httpx.create_ssl_context(trust_env=True)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=10,
            max_keepalive_connections=10,
            keepalive_expiry=5.0,
            network_backend=_CheckedBackend(owner, url, resolver, on_connect),
        )
