"""The host end of the guest-agent channel: the only way the host reaches into a sandbox.

The host *listens* on a Unix socket and the guest agent (`aamp.guest.agent`) dials it: for
gVisor the socket's directory is bind-mounted into the guest, for Firecracker the vsock device
forwards guest connections to it. The agent keeps one idle connection open; each operation
takes that connection, sends one request on it, and the agent dials a fresh spare at once.
So an exec costs one request frame and its answer, with no handshake on the hot path.

Trust: the guest is hostile until proven otherwise. Every frame header is checked before its
payload is read (`aamp.guest.wire`), every JSON message is validated field by field, sizes the
guest claims are never believed beyond `max_file_bytes`, and every wait on the guest has a
timeout. Whatever the guest does, the host gets one of these clean exceptions, and only the
connection concerned is dropped:

- `GuestError`: the guest refused the request and said why (message shown as it came).
- `FileTooLargeError`: a file over `max_file_bytes` (refused before any data moves).
- `GuestProtocolError`: the guest sent something malformed or out of place.
- `GuestTimeout`: the guest went silent.
- `GuestUnavailable`: no guest connection within the timeout, or the guest hung up.
- `PathEscapeError` (a `ValueError`): a put/get path outside /workspace, refused up front.

Usage::

    channel = GuestChannel(sock_path, max_file_bytes=settings.max_file_bytes)
    await channel.start()                      # listen before the guest boots
    ...                                        # start the sandbox
    await channel.wait_ready(timeout=10)
    result, out, err = await channel.run(["python3", "-c", "print(6*7)"], timeout=30)
    async with await channel.exec(["sh", "-c", "make"]) as session:
        async for chunk in session:            # Output("stdout"|"stderr", bytes), live
            ...
    print(session.result.exit_code)
    await channel.put("/workspace/in.csv", data, len(data))
    async with await channel.get("/workspace/out.pdf") as stream:
        async for chunk in stream: ...
    answer = await channel.browser({"action": "snapshot", ...}, timeout=60, max_answer=2**23)
    await channel.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import posixpath
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from aamp.guest import wire

log = logging.getLogger(__name__)

WORKSPACE = "/workspace"
MAX_GUEST_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
# sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
# At most this many idle guest connections are kept (the agent keeps exactly one).
MAX_IDLE_CONNECTIONS = 4
DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024
_ERROR_MESSAGE_CHARS = 2000
# How long a closing connection may take to flush its last frames (e.g. a kill).
_CLOSE_LINGER = 5.0
_ERROR_CODE_RE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz_")


class ChannelError(Exception):
    """Base class of everything the channel raises about the guest."""


class GuestError(ChannelError):
    """The guest agent refused or failed the request and said why."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


class FileTooLargeError(ChannelError, ValueError):
    """A file over the installation's `max_file_bytes`; nothing was transferred."""


class GuestProtocolError(ChannelError):
    """The guest sent something malformed or out of place; its connection was dropped."""


class GuestTimeout(ChannelError, TimeoutError):
    """The guest did not answer within the timeout; its connection was dropped."""


class GuestUnavailable(ChannelError):
    """No guest agent connection (not up yet, gone, or hung up mid-request)."""


class PathEscapeError(ValueError):
    """A guest path that is not inside /workspace (or is not a usable path at all)."""


def workspace_path(path: str) -> str:
    """Normalise a guest path for put/get to an absolute path inside /workspace.

    Relative paths are relative to /workspace. Refuses (with `PathEscapeError`) anything that
    leaves it lexically (``..``, absolute paths elsewhere), NUL bytes, non-UTF-8, and paths or
    names over the kernel's limits. Symlinks inside the guest are the agent's to check: it
    resolves with realpath and refuses anything that lands outside.
    """
    if not isinstance(path, str):
        raise PathEscapeError(f"guest path must be a string, not {type(path).__name__}")
    if not path:
        raise PathEscapeError("guest path is empty")
    if "\x00" in path:
        raise PathEscapeError("guest path contains a NUL byte")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise PathEscapeError("guest path is not valid UTF-8") from None
    if len(encoded) > MAX_GUEST_PATH_BYTES:
        raise PathEscapeError(
            f"guest path is {len(encoded)} bytes, over the limit of {MAX_GUEST_PATH_BYTES}"
        )
    full = posixpath.normpath(posixpath.join(WORKSPACE, path))
    if full.startswith("//"):  # normpath keeps a leading "//"
        full = "/" + full.lstrip("/")
    if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
        raise PathEscapeError(f"guest path {path!r} is outside {WORKSPACE}")
    for name in full.split("/"):
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise PathEscapeError(
                f"guest path has a name over {MAX_NAME_BYTES} bytes: {name[:40]!r}..."
            )
    return full


def _relative(full: str) -> str:
    """What the agent receives: the path relative to its workspace root."""
    return posixpath.relpath(full, WORKSPACE)


@dataclass(frozen=True, slots=True)
class Output:
    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int | None
    signal: int | None
    timed_out: bool
    duration: float
    # Set by `GuestChannel.run` when output beyond its cap was discarded.
    truncated: bool = False


# --- validation of guest messages ------------------------------------------------------------


def _control(ftype: int, payload: bytes, what: str) -> dict[str, Any]:
    if ftype != wire.CONTROL:
        raise GuestProtocolError(
            f"expected a control message {what}, got a {wire.type_name(ftype)} frame"
        )
    try:
        return wire.decode_control(payload)
    except wire.ProtocolError as exc:
        raise GuestProtocolError(f"{what}: {exc}") from None


def _raise_if_error(message: dict[str, Any], what: str) -> None:
    if "error" not in message:
        return
    text, code = message.get("error"), message.get("code", "error")
    if not isinstance(text, str) or not isinstance(code, str):
        raise GuestProtocolError(f"malformed error message {what}")
    if not code or len(code) > 32 or not set(code) <= _ERROR_CODE_RE_CHARS:
        raise GuestProtocolError(f"malformed error code {what}")
    text = text[:_ERROR_MESSAGE_CHARS]
    if code == "too_large":
        raise FileTooLargeError(f"{what}: {text}")
    raise GuestError(f"{what}: {text}", code)


def _field(message: dict[str, Any], key: str, kind: str, what: str) -> Any:
    """Fetch `key` and check its JSON type; `kind` is int, number, bool, str, or one of
    those with a trailing '?' for "may be null"."""
    value = message.get(key)
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if value is None and optional:
        return None
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "number": wire.is_finite_number(value),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }[base]
    if not ok:
        raise GuestProtocolError(f"{what}: field {key!r} must be {kind}, got {value!r:.60}")
    return value


def _parse_hello(ftype: int, payload: bytes) -> dict[str, Any]:
    what = "in the guest's hello"
    hello = _control(ftype, payload, what)
    if hello.get("hello") != "aamp-guest":
        raise GuestProtocolError("the first message is not an aamp guest hello")
    protocol = _field(hello, "protocol", "int", what)
    if protocol != wire.PROTOCOL_VERSION:
        raise GuestProtocolError(
            f"guest speaks protocol {protocol}, the host speaks {wire.PROTOCOL_VERSION}"
        )
    version = _field(hello, "version", "str", what)
    pid = _field(hello, "pid", "int", what)
    if len(version) > 64 or not 0 < pid < 2**31:
        raise GuestProtocolError(f"{what}: version or pid out of range")
    return {"protocol": protocol, "version": version, "pid": pid}


def _parse_health(message: dict[str, Any]) -> dict[str, Any]:
    what = "in the health answer"
    _raise_if_error(message, "health")
    if message.get("ok") is not True:
        raise GuestProtocolError(f"{what}: 'ok' is not true")
    uptime = _field(message, "uptime", "number", what)
    load = message.get("load")
    if load is not None and not (
        isinstance(load, list) and len(load) == 3 and all(wire.is_finite_number(x) for x in load)
    ):
        raise GuestProtocolError(f"{what}: 'load' must be three numbers or null")
    mem = _field(message, "mem_available", "int?", what)
    if uptime < 0 or (mem is not None and mem < 0):
        raise GuestProtocolError(f"{what}: negative uptime or memory")
    return {"ok": True, "uptime": float(uptime), "load": load, "mem_available": mem}


# --- connections --------------------------------------------------------------------------


class _Conn:
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


class GuestChannel:
    """The host end of one sandbox's guest-agent channel (see the module docstring)."""

    def __init__(
        self,
        socket_path: Path,
        *,
        max_file_bytes: int,
        hello_timeout: float = 30.0,
        io_timeout: float = 30.0,
        exec_grace: float = 2.0,
        max_connections: int = 256,
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
        self.hello_timeout = hello_timeout
        self.io_timeout = io_timeout
        self.exec_grace = exec_grace
        self.max_connections = max_connections
        self.last_activity = time.monotonic()
        self.guest_info: dict[str, Any] | None = None
        # The most recent connection the channel refused, and why (for logs and tests).
        self.last_rejection: ChannelError | None = None
        self.rejected_connections = 0
        self._server: asyncio.AbstractServer | None = None
        self._idle: asyncio.Queue[_Conn] = asyncio.Queue()
        self._conns: set[_Conn] = set()
        self._active: set[_Conn] = set()
        self._ready = asyncio.Event()
        self._closed = False
        self._spare_due_until = 0.0
        self._handshakes: set[asyncio.Task[Any]] = set()

    # lifecycle

    async def start(self) -> None:
        """Listen on the socket (mode 0600), replacing a stale socket file left behind."""
        path = self.socket_path
        try:
            st = path.lstat()
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise ValueError(f"{path} exists and is not a socket; refusing to replace it")
            path.unlink()
        self._server = await asyncio.start_unix_server(
            self._on_connect, path=str(path), limit=wire.MAX_PAYLOAD + wire.HEADER_SIZE
        )
        os.chmod(path, 0o600)

    async def close(self) -> None:
        """Stop listening, drop every connection and remove the socket file. Idempotent."""
        self._closed = True
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self._conns):
            conn.close(abort=True)
        if self._handshakes:  # they end at once: their connections were just aborted
            await asyncio.wait(set(self._handshakes), timeout=1.0)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(self.socket_path.lstat().st_mode):
                self.socket_path.unlink()

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
        limit = self.hello_timeout if timeout is None else timeout
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

    def _forget(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        self._active.discard(conn)

    def _reject(self, conn: _Conn, error: ChannelError) -> None:
        if self._closed:
            conn.close(abort=True)
            return
        self.rejected_connections += 1
        self.last_rejection = error
        log.warning("refused a guest connection on %s: %s", self.socket_path, error)
        conn.close(abort=True)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(reader, writer, self._forget)
        if self._closed or len(self._conns) >= self.max_connections:
            self._reject(conn, GuestProtocolError("too many guest connections"))
            return
        self._conns.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)
        try:
            async with asyncio.timeout(self.hello_timeout):
                ftype, payload = await wire.read_frame(
                    reader, max_payload=wire.MAX_GUEST_CONTROL, max_control=wire.MAX_GUEST_CONTROL
                )
            hello = _parse_hello(ftype, payload)
        except TimeoutError:
            self._reject(conn, GuestTimeout(f"no hello within {self.hello_timeout:g}s"))
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

    async def _acquire(self) -> _Conn:
        if self._closed:
            raise GuestUnavailable("the channel is closed")
        self._touch()
        try:
            async with asyncio.timeout(self.io_timeout):
                while True:
                    conn = self._idle.get_nowait() if self._idle.qsize() else await self._idle.get()
                    if conn.alive():
                        self._active.add(conn)
                        self._spare_due_until = time.monotonic() + self.io_timeout
                        return conn
                    conn.close(abort=True)
        except TimeoutError:
            raise GuestUnavailable(
                f"no guest agent connection within {self.io_timeout:g}s"
            ) from None

    async def _read(
        self,
        conn: _Conn,
        what: str,
        *,
        timeout: float | None = None,
        forever: bool = False,
        close_on_timeout: bool = True,
    ) -> tuple[int, bytes]:
        """Read one frame within `timeout` (default: io_timeout; `forever` for a caller that
        bounds the wait itself), turning every way it can go wrong into a channel error and
        dropping the connection."""
        limit = None if forever else (self.io_timeout if timeout is None else timeout)
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

    async def _drain(self, conn: _Conn, what: str) -> None:
        try:
            async with asyncio.timeout(self.io_timeout):
                await conn.writer.drain()
        except TimeoutError:
            conn.close(abort=True)
            raise GuestTimeout(
                f"the guest stopped reading for {self.io_timeout:g}s {what}"
            ) from None
        except (ConnectionError, OSError):
            conn.close(abort=True)
            raise GuestUnavailable(f"the guest closed the connection {what}") from None

    # operations

    async def health(self) -> dict[str, Any]:
        conn = await self._acquire()
        try:
            wire.write_control(conn.writer, {"op": "health"})
            ftype, payload = await self._read(conn, "answering health")
            return _parse_health(_control(ftype, payload, "in the health answer"))
        finally:
            conn.close(abort=True)

    async def exec(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> ExecSession:
        """Start a command; returns the live session (iterate it for output)."""
        _check_exec_args(argv, env, cwd, timeout)
        if stdin is not None and len(stdin) > self.max_file_bytes:
            raise FileTooLargeError(
                f"stdin is {len(stdin)} bytes, over the limit of {self.max_file_bytes}"
            )
        request = {
            "op": "exec",
            "argv": list(argv),
            "env": dict(env or {}),
            "cwd": cwd,
            "stdin": stdin is not None,
            "timeout": timeout,
            "heartbeat": max(self.io_timeout / 3, 0.05),
        }
        encoded = wire.encode_control(request)
        if len(encoded) > wire.MAX_PAYLOAD:
            raise ValueError(f"exec request is {len(encoded)} bytes, over {wire.MAX_PAYLOAD}")
        conn = await self._acquire()
        started = time.monotonic()
        wire.write_frame(conn.writer, wire.CONTROL, encoded)
        session = ExecSession(self, conn, argv[0], started, timeout)
        if stdin is not None:
            if len(stdin) <= wire.MAX_PAYLOAD:
                if stdin:
                    wire.write_frame(conn.writer, wire.STDIN, stdin)
                wire.write_frame(conn.writer, wire.EOF)
            else:
                session._start_stdin(stdin)
        return session

    async def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> tuple[ExecResult, bytes, bytes]:
        """Run a command to its end; keeps at most `max_output` bytes of each stream."""
        buffers = {"stdout": bytearray(), "stderr": bytearray()}
        truncated = False
        session = await self.exec(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout)
        async with session:
            async for out in session:
                buf = buffers[out.stream]
                room = max_output - len(buf)
                if len(out.data) > room:
                    truncated = True
                buf += out.data[: max(room, 0)]
        result = session.result
        assert result is not None
        if truncated:
            result = dataclasses.replace(result, truncated=True)
        return result, bytes(buffers["stdout"]), bytes(buffers["stderr"])

    async def put(self, guest_path: str, source: AsyncIterator[bytes] | bytes, size: int) -> None:
        """Write a file into the guest (atomically: temp file + rename on the guest)."""
        full = workspace_path(guest_path)
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"size must be a non-negative integer, got {size!r}")
        if size > self.max_file_bytes:
            raise FileTooLargeError(
                f"{full} would be {size} bytes, over the limit of {self.max_file_bytes} bytes"
            )
        if isinstance(source, (bytes, bytearray, memoryview)) and len(source) != size:
            raise ValueError(f"size is {size} but the data is {len(source)} bytes")
        what = f"putting {full}"
        conn = await self._acquire()
        try:
            wire.write_control(conn.writer, {"op": "put", "path": _relative(full), "size": size})
            sender = asyncio.create_task(self._send_file(conn, source, size, what))
            reply = asyncio.create_task(self._read(conn, what, forever=True))
            try:
                await self._finish_put(sender, reply, size, what, full)
            finally:
                for task in (sender, reply):
                    if not task.done():
                        task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            self._touch()
        finally:
            conn.close(abort=True)

    async def _finish_put(
        self,
        sender: asyncio.Task[None],
        reply: asyncio.Task[tuple[int, bytes]],
        size: int,
        what: str,
        full: str,
    ) -> None:
        """Wait for the guest's answer while the data goes out. The guest may answer early
        (a refusal); if sending fails, its answer (if any) says why."""
        await asyncio.wait({sender, reply}, return_when=asyncio.FIRST_COMPLETED)
        send_error = sender.exception() if sender.done() else None
        if isinstance(send_error, ValueError):
            raise send_error  # our own source misbehaved; the connection is dropped
        if not reply.done():
            await asyncio.wait({reply}, timeout=self.io_timeout)
            if not reply.done():
                if send_error is not None:
                    raise send_error
                raise GuestTimeout(f"the guest did not confirm within {self.io_timeout:g}s {what}")
        reply_error = reply.exception()
        if reply_error is not None:
            # A guest that stopped reading (send_error) is the cause of the hang-up it sees.
            raise send_error or reply_error
        ftype, payload = reply.result()
        message = _control(ftype, payload, f"answering {what}")
        _raise_if_error(message, f"put {full}")
        if message.get("ok") is not True or message.get("size") != size:
            raise GuestProtocolError(f"unexpected answer {what}")
        if not sender.done():  # it may still be returning from its last drain
            await asyncio.wait({sender}, timeout=self.io_timeout)
        if not sender.done() or sender.exception() is not None:
            raise GuestProtocolError(f"the guest confirmed before receiving all data {what}")

    async def _send_file(
        self, conn: _Conn, source: AsyncIterator[bytes] | bytes, size: int, what: str
    ) -> None:
        sent = 0
        if isinstance(source, (bytes, bytearray, memoryview)):
            view = memoryview(source)
            for start in range(0, len(view), wire.DATA_CHUNK):
                wire.write_frame(conn.writer, wire.DATA, view[start : start + wire.DATA_CHUNK])
                await self._drain(conn, what)
            sent = len(view)
        else:
            async for chunk in source:
                view = memoryview(chunk)
                sent += len(view)
                if sent > size:
                    conn.close(abort=True)
                    raise ValueError(f"the source gave more than the declared {size} bytes")
                for start in range(0, len(view), wire.DATA_CHUNK):
                    wire.write_frame(conn.writer, wire.DATA, view[start : start + wire.DATA_CHUNK])
                    await self._drain(conn, what)
        if sent != size:
            conn.close(abort=True)
            raise ValueError(f"the source gave {sent} bytes, not the declared {size}")
        wire.write_frame(conn.writer, wire.EOF)
        await self._drain(conn, what)
        self._touch()

    async def get(self, guest_path: str) -> GetStream:
        """Open a file in the guest for reading; its size is known before any data."""
        full = workspace_path(guest_path)
        what = f"getting {full}"
        conn = await self._acquire()
        try:
            wire.write_control(
                conn.writer,
                {"op": "get", "path": _relative(full), "max_size": self.max_file_bytes},
            )
            ftype, payload = await self._read(conn, what)
            message = _control(ftype, payload, what)
            _raise_if_error(message, f"get {full}")
            size = _field(message, "size", "int", what)
            if not 0 <= size <= self.max_file_bytes:
                # We told the guest the limit; claiming more is misbehaviour, not a big file.
                raise GuestProtocolError(
                    f"the guest claims {size} bytes {what}, beyond the limit it was given "
                    f"({self.max_file_bytes})"
                )
        except BaseException:
            conn.close(abort=True)
            raise
        return GetStream(self, conn, full, size)

    async def browser(self, request: dict[str, Any], *, timeout: float, max_answer: int) -> bytes:
        """One request to the sandbox's browser driver, which the guest agent starts on first
        use and keeps across requests. Returns the driver's answer as it came: untrusted JSON
        bytes, at most `max_answer` of them, within `timeout` seconds."""
        encoded = wire.encode_control({"op": "browser", "request": request, "timeout": timeout})
        if len(encoded) > wire.MAX_PAYLOAD:
            raise ValueError(f"browser request is {len(encoded)} bytes, over {wire.MAX_PAYLOAD}")
        what = "answering a browser request"
        conn = await self._acquire()
        deadline = time.monotonic() + timeout
        try:
            wire.write_frame(conn.writer, wire.CONTROL, encoded)
            chunks: list[bytes] = []
            size = 0
            while True:
                left = max(0.001, deadline - time.monotonic())
                ftype, payload = await self._read(conn, what, timeout=left)
                if ftype == wire.EOF:
                    return b"".join(chunks)
                if ftype == wire.CONTROL:
                    _raise_if_error(_control(ftype, payload, what), "browser")
                if ftype != wire.DATA:
                    raise GuestProtocolError(f"unexpected {wire.type_name(ftype)} frame {what}")
                size += len(payload)
                if size > max_answer:
                    raise GuestProtocolError(f"the guest sent over {max_answer} bytes {what}")
                chunks.append(payload)
        finally:
            conn.close(abort=True)


def _check_exec_args(
    argv: list[str], env: dict[str, str] | None, cwd: str | None, timeout: float | None
) -> None:
    if not isinstance(argv, (list, tuple)) or not argv:
        raise ValueError("argv must be a non-empty list of strings")
    for arg in argv:
        if not isinstance(arg, str) or "\x00" in arg:
            raise ValueError(f"argv items must be strings without NUL bytes, got {arg!r:.60}")
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise ValueError(f"bad environment variable name {key!r:.60}")
        if not isinstance(value, str) or "\x00" in value:
            raise ValueError(f"environment variable {key} must be a string without NUL bytes")
    if cwd is not None and (not isinstance(cwd, str) or not cwd or "\x00" in cwd):
        raise ValueError("cwd must be a non-empty string without NUL bytes")
    if timeout is not None and not (wire.is_finite_number(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


class ExecSession:
    """One running command. Iterate it for `Output` as it arrives; when iteration ends,
    `result` is set. Leaving the `async with` block early kills the command."""

    def __init__(
        self,
        channel: GuestChannel,
        conn: _Conn,
        argv0: str,
        started: float,
        timeout: float | None,
    ) -> None:
        self._channel = channel
        self._conn = conn
        self._argv0 = argv0
        self._started = started
        self._timeout = timeout
        # Past this instant the host stops waiting for the guest to end the command.
        self._hard_deadline = started + timeout + channel.exec_grace if timeout else None
        self._killed = False
        self._stdin_task: asyncio.Task[None] | None = None
        self.result: ExecResult | None = None

    def _start_stdin(self, data: bytes) -> None:
        self._stdin_task = asyncio.create_task(self._send_stdin(data))

    async def _send_stdin(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            for start in range(0, len(view), wire.DATA_CHUNK):
                wire.write_frame(
                    self._conn.writer, wire.STDIN, view[start : start + wire.DATA_CHUNK]
                )
                await self._channel._drain(self._conn, "sending stdin")
            wire.write_frame(self._conn.writer, wire.EOF)
        except (ChannelError, ConnectionError, RuntimeError):
            pass  # the exec's own reads report what happened to the connection

    def __aiter__(self) -> ExecSession:
        return self

    async def __anext__(self) -> Output:
        while self.result is None:
            if self._conn.closed:
                raise GuestUnavailable("the exec's connection is closed")
            ftype, payload = await self._next_frame()
            if self.result is not None:
                break
            if ftype == wire.STDOUT:
                return Output("stdout", payload)
            if ftype == wire.STDERR:
                return Output("stderr", payload)
            message = _control(ftype, payload, "during exec")
            if message.get("keepalive") is True and len(message) == 1:
                continue
            _raise_if_error(message, f"exec {self._argv0}")
            self._finish(self._parse_result(message))
        raise StopAsyncIteration

    async def _next_frame(self) -> tuple[int, bytes]:
        channel = self._channel
        limit = channel.io_timeout
        if self._hard_deadline is not None:
            limit = min(limit, self._hard_deadline - time.monotonic())
        try:
            return await channel._read(
                self._conn, "during exec", timeout=max(limit, 0.0), close_on_timeout=False
            )
        except GuestTimeout:
            expired = self._hard_deadline is not None and time.monotonic() >= self._hard_deadline
            # Tell the guest to kill the command, then hang up (the guest also kills the
            # process group when the host hangs up).
            self._send_kill()
            self._conn.close()
            if not expired:
                raise
            if self._killed and not (self._timeout and self._past_timeout()):
                raise GuestTimeout(
                    f"the guest did not confirm the kill within {channel.exec_grace:g}s"
                ) from None
            # The guest did not end the command in time: the host ends it.
            self._finish(ExecResult(None, None, True, time.monotonic() - self._started))
            return wire.CONTROL, b""

    def _past_timeout(self) -> bool:
        assert self._timeout is not None
        return time.monotonic() >= self._started + self._timeout

    def _parse_result(self, message: dict[str, Any]) -> ExecResult:
        what = "in the exec result"
        exit_code = _field(message, "exit_code", "int?", what)
        signal = _field(message, "signal", "int?", what)
        timed_out = _field(message, "timed_out", "bool", what)
        if (exit_code is None) == (signal is None):
            raise GuestProtocolError(f"{what}: exactly one of exit_code and signal must be set")
        if exit_code is not None and not 0 <= exit_code <= 255:
            raise GuestProtocolError(f"{what}: exit code {exit_code} out of range")
        if signal is not None and not 1 <= signal <= 128:
            raise GuestProtocolError(f"{what}: signal {signal} out of range")
        return ExecResult(exit_code, signal, timed_out, time.monotonic() - self._started)

    def _finish(self, result: ExecResult) -> None:
        self.result = result
        if self._stdin_task is not None and not self._stdin_task.done():
            self._stdin_task.cancel()
        self._conn.close()
        self._channel._touch()

    def _send_kill(self) -> None:
        if not self._conn.closed:
            with contextlib.suppress(Exception):
                wire.write_control(self._conn.writer, {"op": "kill"})

    async def kill(self) -> None:
        """Kill the command's whole process group. Iteration then ends with the result
        (signal 9); if the guest does not confirm within the grace period, `GuestTimeout`."""
        if self.result is not None or self._conn.closed:
            return
        self._killed = True
        self._send_kill()
        deadline = time.monotonic() + self._channel.exec_grace
        if self._hard_deadline is None or deadline < self._hard_deadline:
            self._hard_deadline = deadline

    async def wait(self) -> ExecResult:
        """Discard remaining output and return the result."""
        async for _ in self:
            pass
        assert self.result is not None
        return self.result

    async def __aenter__(self) -> ExecSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.result is None and not self._conn.closed:
            # Closing the connection makes the guest kill the process group too.
            self._send_kill()
            self._conn.close()
        if self._stdin_task is not None and not self._stdin_task.done():
            self._stdin_task.cancel()


class GetStream:
    """A file coming out of the guest: `size` is known and checked against the limit before
    the first chunk; iteration yields chunks and fails if the guest sends more or fewer bytes
    than it announced. Use as `async with` (or call `aclose`) to drop the connection early."""

    def __init__(self, channel: GuestChannel, conn: _Conn, path: str, size: int) -> None:
        self._channel = channel
        self._conn = conn
        self.path = path
        self.size = size
        self.received = 0
        self._done = False

    def __aiter__(self) -> GetStream:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        what = f"getting {self.path}"
        ftype, payload = await self._channel._read(self._conn, what)
        if ftype == wire.DATA:
            self.received += len(payload)
            if self.received > self.size:
                self._conn.close(abort=True)
                raise GuestProtocolError(
                    f"the guest sent more than the {self.size} bytes it announced {what}"
                )
            return payload
        if ftype == wire.EOF:
            self._done = True
            self._conn.close()
            if self.received != self.size:
                raise GuestProtocolError(
                    f"the guest sent {self.received} of the {self.size} bytes it announced {what}"
                )
            return await self.__anext__()
        try:
            message = _control(ftype, payload, what)
            _raise_if_error(message, f"get {self.path}")
            raise GuestProtocolError(f"unexpected control message {what}")
        finally:
            self._conn.close(abort=True)

    async def read_all(self) -> bytes:
        buf = bytearray()
        async for chunk in self:
            buf += chunk
        return bytes(buf)

    async def aclose(self) -> None:
        self._done = True
        self._conn.close(abort=True)

    async def __aenter__(self) -> GetStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
