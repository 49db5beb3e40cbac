"""Zero-copy byte moving for the egress proxy: splice(2) between sockets through a pipe.

Bodies and tunnels are most of the bytes a proxy moves, and copying them through Python
(recv into a bytes object, StreamReader buffer, write) costs more CPU than everything else
the proxy does. On Linux the kernel can move them instead: socket → pipe → socket with
`os.splice`, the bytes never entering the interpreter. The proxy still decides *how many*
bytes move (a Content-Length, a chunk size, the `max_bytes_out` room) and counts every byte;
only the copying is handed to the kernel.

Two uses:
- a CONNECT tunnel: both sockets are taken out of their asyncio transports for good
  (`detach`) and spliced until each side ends;
- a plain-HTTP body on a kept-alive connection: the request and response *heads* are still
  read and checked by the proxy's parser through the asyncio streams; only the body between
  them is spliced, with the source transport's reading paused (`reading_paused`) and the
  sink's write buffer emptied first (`flushed`) so no byte is reordered. Sockets a transport
  owns are waited on through a duplicate descriptor (`owned_fd`): asyncio refuses a reader or
  writer callback on a descriptor that belongs to a transport.

Anything that is not a plain socket (TLS, a non-Linux host) is left to the stream copy path.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
from collections.abc import Callable, Iterator

PIPE_BYTES = 1024 * 1024  # pipe capacity asked for, and the most moved per splice call
MIN_BODY = 64 * 1024  # smaller bodies are copied: a pipe and two descriptors cost more
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ on Linux (not named by the module before 3.10)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


class CapReached(Exception):
    """The sender had more to send but the byte budget (`max_bytes_out`) is spent."""


def available() -> bool:
    return hasattr(os, "splice")


def plain_socket(writer: asyncio.StreamWriter) -> socket.socket | None:
    """The socket under a stream if its bytes are the application's own (no TLS layer) and
    the transport is still open; otherwise None."""
    if writer.get_extra_info("ssl_object") is not None or writer.transport.is_closing():
        return None
    sock = writer.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return None
    return sock


def detach(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> tuple[socket.socket, bytes] | None:
    """Take a connection's socket out of its asyncio transport for good, with any bytes the
    reader had already buffered. None if this transport cannot be taken over."""
    buffer = getattr(reader, "_buffer", None)  # StreamReader keeps read-ahead here
    sock = writer.get_extra_info("socket")
    transport = writer.transport
    if not isinstance(buffer, bytearray) or sock is None or transport.get_write_buffer_size():
        return None
    transport.pause_reading()
    left = bytes(buffer)
    buffer.clear()
    taken = socket.socket(fileno=os.dup(sock.fileno()))
    taken.setblocking(False)
    transport.abort()  # closes only the transport's descriptor; `taken` keeps the socket
    return taken, left


def read_ahead(reader: asyncio.StreamReader) -> bytearray | None:
    """The bytes a StreamReader has buffered but not yet handed out (None: not knowable)."""
    buffer = getattr(reader, "_buffer", None)
    return buffer if isinstance(buffer, bytearray) else None


@contextlib.contextmanager
def reading_paused(
    reader: asyncio.StreamReader, transport: asyncio.BaseTransport
) -> Iterator[None]:
    """Stop the transport feeding `reader` while its socket is read directly.

    The caller empties the reader's buffer inside; on the way out reading resumes (and the
    reader's own flow-control flag is reset, its buffer being empty)."""
    transport.pause_reading()  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if not transport.is_closing():
            if getattr(reader, "_paused", False):
                reader._paused = False  # type: ignore[attr-defined]
            transport.resume_reading()  # type: ignore[attr-defined]


async def flushed(writer: asyncio.StreamWriter) -> None:
    """Wait until everything written to `writer` has left its transport's buffer, so bytes
    spliced into the socket next come after it."""
    transport = writer.transport
    if not transport.get_write_buffer_size():
        return
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0, low=0)  # drain() now waits for an empty buffer
    try:
        await writer.drain()
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)


@contextlib.contextmanager
def owned_fd(sock: socket.socket) -> Iterator[int]:
    """A duplicate descriptor of a transport's socket, to splice and wait on."""
    fd = os.dup(sock.fileno())
    try:
        yield fd
    finally:
        os.close(fd)


async def wait_ready(fd: int, *, write: bool) -> None:
    """Wait until `fd` is readable (or writable)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    wake = lambda: future.done() or future.set_result(None)  # noqa: E731
    if write:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await future
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


async def move(
    src: int,
    dst: int,
    *,
    length: int | None,
    room: Callable[[int], int],
    count: Callable[[int], None],
) -> None:
    """Move bytes from socket `src` to socket `dst` until `length` bytes have moved, or (with
    `length=None`) until `src` ends. `room(n)` says how many of n bytes may move now (the
    byte budget); `count(n)` is told every n bytes that reached `dst`.

    Raises `asyncio.IncompleteReadError` if `src` ends before `length`, and `CapReached` if
    `room` allows nothing and `src` has another byte to send."""
    pipe_r, pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(pipe_w, _F_SETPIPE_SZ, PIPE_BYTES)
        remaining = length
        while remaining is None or remaining > 0:
            want = PIPE_BYTES if remaining is None else min(PIPE_BYTES, remaining)
            size = room(want)
            try:
                # With no room, one byte is taken into the pipe (never forwarded) to learn
                # whether the sender has more: then the budget is exceeded.
                n = os.splice(src, pipe_w, size or 1, flags=_FLAGS)
            except BlockingIOError:
                await wait_ready(src, write=False)
                continue
            if n == 0:
                if remaining is None:
                    return
                raise asyncio.IncompleteReadError(b"", remaining)
            if size == 0:
                raise CapReached()
            if remaining is not None:
                remaining -= n
            pending = n
            while pending:
                try:
                    moved = os.splice(pipe_r, dst, pending, flags=_FLAGS)
                except BlockingIOError:
                    await wait_ready(dst, write=True)
                    continue
                pending -= moved
                count(moved)
    finally:
        os.close(pipe_r)
        os.close(pipe_w)
