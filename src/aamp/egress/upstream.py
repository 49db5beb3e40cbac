"""Connections to upstreams: to an address the decision checked, never to a name.

`Connector.open` dials the verdict's addresses in order (no name lookup happens here, so the
address connected to is always one that was checked) and returns the first that answers; with
`tls` it speaks TLS to it, verifying the certificate for the host (service upstreams), over a
`tls_socket.TLSSocketTransport`: OpenSSL decrypts records from the socket straight into one
receive buffer of the connection's own.

What a plain upstream sends is received into one buffer of the connection's own as well
(`_ReceivingInto`, an asyncio buffered protocol) and from there handed to the connection's
`StreamReader`, instead of into a new object per read.
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
from aamp.egress.tls_streams import handshake, open_stream
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

    async def _open_tls(
        self, sock: socket.socket, host: Host
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """TLS to a service upstream over a `TLSSocketTransport` (the certificate verified for
        `host`), within the connect timeout that runs around it."""
        context = self._tls_context()
        tls = await handshake(
            sock,
            context,
            server_side=False,
            server_hostname=tls_server_name(host),
            timeout=self.limits.connect_timeout,
        )
        return open_stream(tls, context, limit=4 * self.limits.chunk_bytes)

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
                    if tls:
                        reader, writer = await self._open_tls(sock, host)
                    else:
                        reader = asyncio.StreamReader(limit=4 * limits.chunk_bytes)
                        transport, protocol = await loop.create_connection(
                            lambda: _ReceivingInto(reader),  # noqa: B023 - called at once
                            sock=sock,
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
