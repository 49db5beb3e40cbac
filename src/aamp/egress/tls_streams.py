"""TLS connections for the egress proxy, onto `TLSSocketTransport` (`tls_socket.py`).

`handshake` wraps a connected socket and runs the TLS handshake under a timeout; `take_over`
moves an established stream (the guest's, after `CONNECT`, its socket taken with
`detach_socket`) onto a transport over it; `open_stream` makes a new stream pair over one.
Every context the proxy makes is `harden`ed first: no renegotiation.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl

from aamp.egress.splice import wait_ready
from aamp.egress.tls_socket import TLSSocketTransport


def harden(context: ssl.SSLContext) -> ssl.SSLContext:
    """Refuse TLS 1.2 renegotiation on `context` (nothing the proxy does needs it)."""
    context.options |= ssl.OP_NO_RENEGOTIATION
    return context


async def handshake(
    sock: socket.socket,
    context: ssl.SSLContext,
    *,
    server_side: bool,
    server_hostname: str | None = None,
    timeout: float,
) -> ssl.SSLSocket:
    """Wrap the connected `sock` (its descriptor moves to the result) and run the handshake
    within `timeout` seconds (`TimeoutError`). On any failure the socket is closed."""
    sock.setblocking(False)
    tls = context.wrap_socket(
        sock,
        server_side=server_side,
        server_hostname=server_hostname,
        do_handshake_on_connect=False,
    )
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    tls.do_handshake()
                    return tls
                except ssl.SSLWantReadError:
                    await wait_ready(tls.fileno(), write=False)
                except ssl.SSLWantWriteError:
                    await wait_ready(tls.fileno(), write=True)
    except BaseException:
        tls.close()
        raise


def detach_socket(writer: asyncio.StreamWriter) -> socket.socket:
    """The stream's socket (a duplicate descriptor), its transport shut without its protocol
    hearing of it: the protocol and reader live on over the transport that takes over."""
    transport = writer.transport
    sock = writer.get_extra_info("socket")
    if sock is None or transport.get_write_buffer_size():
        raise ConnectionResetError("the connection cannot be taken over")
    taken = socket.socket(fileno=os.dup(sock.fileno()))
    taken.setblocking(False)
    transport.pause_reading()  # type: ignore[attr-defined]
    transport.set_protocol(asyncio.Protocol())  # its connection_lost goes nowhere
    transport.abort()  # closes only the transport's descriptor; `taken` keeps the socket
    return taken


def take_over(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    tls: ssl.SSLSocket,
    context: ssl.SSLContext,
) -> None:
    """Serve the stream (`reader`, `writer`, its protocol) over `tls` from now on."""
    protocol = writer._protocol  # type: ignore[attr-defined]
    transport = TLSSocketTransport(tls, protocol, context)
    reader._transport = transport  # type: ignore[attr-defined] # its flow control pauses this
    writer._transport = transport  # type: ignore[attr-defined]
    protocol._replace_writer(writer)  # the protocol now knows it is over TLS


def open_stream(
    tls: ssl.SSLSocket, context: ssl.SSLContext, *, limit: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A new stream pair over an established `tls` socket."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport = TLSSocketTransport(tls, protocol, context)
    protocol.connection_made(transport)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)
