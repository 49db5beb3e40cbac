"""Connections to upstreams: to an address the decision checked, never to a name.

`Connector.open` dials the verdict's addresses in order (no name lookup happens here, so the
address connected to is always one that was checked) and returns the first that answers; with
`tls` it speaks TLS to it, verifying the certificate for the host (service upstreams).

What an upstream sends is received into one buffer of the connection's own (`_ReceivingInto`,
an asyncio buffered protocol) and from there handed to the connection's `StreamReader`. With
TLS that lets OpenSSL decrypt records straight into it: the default (a stream protocol) makes
asyncio allocate a fresh 256 KiB object for every 16 KiB record it decrypts and join them, and
that allocation churn (a page fault per 4 KiB moved) was the largest part of the proxy's CPU
on a scrubbed service download after the crypto itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass

from aamp.egress.http1 import Refusal
from aamp.egress.intercept import tls_server_name, upstream_tls_context
from aamp.egress.limits import ProxyLimits
from aamp.egress.meter import Attempt
from aamp.policy.addresses import IPAddress
from aamp.policy.hosts import Host

RECEIVE_BYTES = 64 * 1024  # one upstream connection's receive buffer


class _ReceivingInto(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """A `StreamReaderProtocol` whose transport (plain or TLS) writes what arrives into one
    buffer kept for the connection, instead of into a new object per read."""

    def __init__(self, reader: asyncio.StreamReader):
        super().__init__(reader)
        self._into = memoryview(bytearray(RECEIVE_BYTES))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._into

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._into[:nbytes])  # the reader copies it into its buffer


@dataclass
class Upstream:
    host: Host
    port: int
    address: IPAddress
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    tls: bool = False

    def open_to(self, host: Host, port: int) -> bool:
        """Whether this connection goes to (host, port) and the upstream has not closed it."""
        same = self.host == host and self.port == port
        return same and not self.reader.at_eof() and not self.writer.is_closing()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


class Connector:
    def __init__(self, limits: ProxyLimits, upstream_tls: ssl.SSLContext | None = None):
        self.limits = limits
        self._upstream_tls = upstream_tls

    def _tls_context(self) -> ssl.SSLContext:
        if self._upstream_tls is None:
            self._upstream_tls = upstream_tls_context()
        return self._upstream_tls

    def _tls_options(self, host: Host, tls: bool) -> dict[str, object]:
        if not tls:
            return {}
        return {
            "ssl": self._tls_context(),
            "server_hostname": tls_server_name(host),
            "ssl_handshake_timeout": self.limits.connect_timeout,
        }

    async def open(
        self,
        host: Host,
        port: int,
        addresses: Iterable[IPAddress],
        attempt: Attempt,
        *,
        tls: bool = False,
    ) -> Upstream:
        """Connect to the first checked address that answers; `Refusal` 502/504 if none does."""
        loop = asyncio.get_running_loop()
        limits = self.limits
        last_error = "no address"
        for address in addresses:
            attempt.address = str(address)
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                async with asyncio.timeout(limits.connect_timeout):
                    await loop.sock_connect(sock, (str(address), port))
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    reader = asyncio.StreamReader(limit=4 * limits.chunk_bytes)
                    transport, protocol = await loop.create_connection(
                        lambda: _ReceivingInto(reader),  # noqa: B023 - called at once
                        sock=sock,
                        **self._tls_options(host, tls),
                    )
                    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            except TimeoutError:
                sock.close()
                last_error = f"connecting to {address} port {port} timed out"
                continue
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                last_error = (
                    f"the certificate of {address} port {port} is not trusted for {host}: "
                    f"{exc.verify_message}"
                )
                continue
            except ssl.SSLError as exc:
                sock.close()
                last_error = f"TLS with {address} port {port} failed: {exc.reason or exc}"
                continue
            except OSError as exc:
                sock.close()
                last_error = f"cannot connect to {address} port {port}: {exc.strerror or exc}"
                continue
            with contextlib.suppress(Exception):
                writer.transport.set_write_buffer_limits(high=4 * limits.chunk_bytes)
            return Upstream(host, port, address, reader, writer, tls)
        status = 504 if "timed out" in last_error else 502
        rule = attempt.decision.rule if attempt.decision else "upstream"
        raise Refusal(status, rule, last_error)
