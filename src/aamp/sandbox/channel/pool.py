"""The channel's connections: listen, take each guest connection's hello, hand one out per request.

The guest agent dials the host's socket and keeps one idle connection open; a request takes it
(`_acquire`) and the agent dials a fresh spare at once. A connection is refused (and counted)
for a bad or late hello, or when there are too many. Every read and drain has a timeout, and
any failure becomes a channel error that drops that connection alone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aamp.guest import wire
from aamp.sandbox.channel.errors import (
    ChannelError,
    GuestProtocolError,
    GuestTimeout,
    GuestUnavailable,
)
from aamp.sandbox.channel.messages import parse_hello
from aamp.unix_socket import listen_private, stop_listening

log = logging.getLogger(__name__)

# sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
# At most this many idle guest connections are kept (the agent keeps exactly one).
MAX_IDLE_CONNECTIONS = 4
# How long a closing connection may take to flush its last frames (e.g. a kill).
_CLOSE_LINGER = 5.0


class Conn:
    """One accepted guest connection; used for exactly one request, then closed."""

    __slots__ = ("_on_close", "closed", "hello", "reader", "writer")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_close: Any
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.hello: dict[str, Any] | None = None
        self.closed = False
        self._on_close = on_close

    def alive(self) -> bool:
        return (
            not self.closed
            and not self.reader.at_eof()
            and self.reader.exception() is None
            and not self.writer.is_closing()
        )

    def close(self, *, abort: bool = False) -> None:
        """Close; `abort` drops unsent data (for a guest that stopped reading)."""
        if self.closed:
            return
        self.closed = True
        transport = self.writer.transport
        if abort:
            transport.abort()
        else:
            self.writer.close()
            if transport.get_write_buffer_size():
                # A guest that stopped reading must not keep the transport alive forever.
                asyncio.get_running_loop().call_later(_CLOSE_LINGER, transport.abort)
        self._on_close(self)


class HoldsConnection:
    """What holds one request's connection (a running command, a file coming out): leaving
    its `async with` block calls `aclose`, which lets the connection go."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


@dataclass(frozen=True)
class ChannelLimits:
    """How long the host waits on a guest and how many connections it takes from one."""

    hello_timeout: float = 30.0  # for a new connection's hello
    io_timeout: float = 30.0  # for each read and drain of a request
    exec_grace: float = 2.0  # past a command's own timeout, for the guest to end it
    max_connections: int = 256


class ConnectionPool:
    """The listening socket and the guest's connections: one per request, each checked at
    its hello, with a timeout on every read and drain. `GuestChannel` adds the operations."""

    def __init__(
        self, socket_path: Path, *, max_file_bytes: int, limits: ChannelLimits = ChannelLimits()
    ) -> None:
        socket_path = Path(socket_path)
        size = len(os.fsencode(socket_path))
        if size > MAX_SOCKET_PATH_BYTES:
            raise ValueError(
                f"channel socket path {str(socket_path)!r} is {size} bytes; Unix socket paths "
                f"are limited to {MAX_SOCKET_PATH_BYTES} bytes, so use a shorter directory"
            )
        if max_file_bytes <= 0:
            raise ValueError("max_file_bytes must be positive")
        self.socket_path = socket_path
        self.max_file_bytes = max_file_bytes
        self.limits = limits
        self.last_activity = time.monotonic()
        self.guest_info: dict[str, Any] | None = None
        # The most recent connection the channel refused, and why (for logs and tests).
        self.last_rejection: ChannelError | None = None
        self.rejected_connections = 0
        self._server: asyncio.AbstractServer | None = None
        self._idle: asyncio.Queue[Conn] = asyncio.Queue()
        self._conns: set[Conn] = set()
        self._active: set[Conn] = set()
        self._ready = asyncio.Event()
        self._closed = False
        self._spare_due_until = 0.0
        self._handshakes: set[asyncio.Task[Any]] = set()

    # lifecycle

    async def start(self) -> None:
        """Listen on the socket (mode 0600), replacing a stale socket file left behind."""
        self._server = await listen_private(
            self.socket_path, self._on_connect, limit=wire.MAX_PAYLOAD + wire.HEADER_SIZE
        )

    async def close(self) -> None:
        """Stop listening, drop every connection and remove the socket file. Idempotent."""
        self._closed = True
        stop_listening(self._server, self.socket_path)
        self._server = None
        for conn in list(self._conns):
            conn.close(abort=True)
        if self._handshakes:  # they end at once: their connections were just aborted
            await asyncio.wait(set(self._handshakes), timeout=1.0)

    @property
    def connected(self) -> bool:
        """Whether the guest agent is connected: it has a connection open (idle or serving a
        request), or a request just took its idle one and its next spare is due (the agent
        dials it at once; if it never comes, this turns false after io_timeout)."""
        if any(c.alive() for c in self._conns if c.hello is not None):
            return True
        return not self._closed and time.monotonic() < self._spare_due_until

    async def wait_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the guest agent's first hello; returns it (protocol, version, pid)."""
        limit = self.limits.hello_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                await self._ready.wait()
        except TimeoutError:
            rejected = self.last_rejection
            reason = f" (last refused connection: {rejected})" if rejected else ""
            raise GuestUnavailable(
                f"the guest agent did not connect within {limit:g}s{reason}"
            ) from None
        assert self.guest_info is not None
        return self.guest_info

    def _touch(self) -> None:
        self.last_activity = time.monotonic()

    def _forget(self, conn: Conn) -> None:
        self._conns.discard(conn)
        self._active.discard(conn)

    def _reject(self, conn: Conn, error: ChannelError) -> None:
        if self._closed:
            conn.close(abort=True)
            return
        self.rejected_connections += 1
        self.last_rejection = error
        log.warning("refused a guest connection on %s: %s", self.socket_path, error)
        conn.close(abort=True)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(reader, writer, self._forget)
        if self._closed or len(self._conns) >= self.limits.max_connections:
            self._reject(conn, GuestProtocolError("too many guest connections"))
            return
        self._conns.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)
        try:
            async with asyncio.timeout(self.limits.hello_timeout):
                ftype, payload = await wire.read_frame(
                    reader, max_payload=wire.MAX_GUEST_CONTROL, max_control=wire.MAX_GUEST_CONTROL
                )
            hello = parse_hello(ftype, payload)
        except TimeoutError:
            self._reject(conn, GuestTimeout(f"no hello within {self.limits.hello_timeout:g}s"))
            return
        except wire.ProtocolError as exc:
            self._reject(conn, GuestProtocolError(f"bad hello frame: {exc}"))
            return
        except GuestProtocolError as exc:
            self._reject(conn, exc)
            return
        except (EOFError, OSError):
            self._reject(conn, GuestProtocolError("connection closed before the hello"))
            return
        except asyncio.CancelledError:
            # Loop shutdown: end quietly (nobody awaits this server-callback task, and
            # Python 3.11's stream server logs a cancelled one as an error).
            conn.close(abort=True)
            return
        if self._idle.qsize() >= MAX_IDLE_CONNECTIONS:
            self._reject(conn, GuestProtocolError("too many idle guest connections"))
            return
        conn.hello = hello
        self.guest_info = hello
        self._spare_due_until = 0.0
        self._ready.set()
        self._idle.put_nowait(conn)

    async def _acquire(self) -> Conn:
        if self._closed:
            raise GuestUnavailable("the channel is closed")
        self._touch()
        try:
            async with asyncio.timeout(self.limits.io_timeout):
                while True:
                    conn = self._idle.get_nowait() if self._idle.qsize() else await self._idle.get()
                    if conn.alive():
                        self._active.add(conn)
                        self._spare_due_until = time.monotonic() + self.limits.io_timeout
                        return conn
                    conn.close(abort=True)
        except TimeoutError:
            raise GuestUnavailable(
                f"no guest agent connection within {self.limits.io_timeout:g}s"
            ) from None

    async def _read(
        self,
        conn: Conn,
        what: str,
        *,
        timeout: float | None = None,
        forever: bool = False,
        close_on_timeout: bool = True,
    ) -> tuple[int, bytes]:
        """Read one frame within `timeout` (default: io_timeout; `forever` for a caller that
        bounds the wait itself), turning every way it can go wrong into a channel error and
        dropping the connection."""
        limit = None if forever else (self.limits.io_timeout if timeout is None else timeout)
        try:
            async with asyncio.timeout(limit):
                frame = await wire.read_frame(conn.reader)
        except TimeoutError:
            if close_on_timeout:
                conn.close(abort=True)
            raise GuestTimeout(f"the guest sent nothing for {limit:g}s {what}") from None
        except wire.ProtocolError as exc:
            conn.close(abort=True)
            raise GuestProtocolError(f"{what}: {exc}") from None
        except (EOFError, OSError):
            conn.close(abort=True)
            raise GuestUnavailable(f"the guest closed the connection {what}") from None
        self._touch()
        return frame

    async def _drain(self, conn: Conn, what: str) -> None:
        try:
            async with asyncio.timeout(self.limits.io_timeout):
                await conn.writer.drain()
        except TimeoutError:
            conn.close(abort=True)
            raise GuestTimeout(
                f"the guest stopped reading for {self.limits.io_timeout:g}s {what}"
            ) from None
        except (ConnectionError, OSError):
            conn.close(abort=True)
            raise GuestUnavailable(f"the guest closed the connection {what}") from None

    # operations
