"""`GuestChannel`: the operations on a sandbox's guest — health, exec, run, put, get, browser.

Each operation takes one connection from the pool (`pool.py`), sends one request on it, and
checks the answer (`messages.py`); a running command is an `ExecSession`, a file coming out a
`GetStream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from aamp.guest import wire
from aamp.sandbox.channel.downloads import GetStream
from aamp.sandbox.channel.errors import FileTooLargeError, GuestProtocolError, GuestTimeout
from aamp.sandbox.channel.exec_session import ExecResult, ExecSession, Output
from aamp.sandbox.channel.messages import (
    check_exec_args,
    control,
    field,
    parse_health,
    raise_if_error,
)
from aamp.sandbox.channel.pool import Conn, ConnectionPool
from aamp.sandbox.channel.workspace import relative, workspace_path

DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024


class Session(Protocol):
    """A running command: `ExecSession`, or one on another host (`aamp.fleet.link_client`)."""

    result: ExecResult | None

    async def __aenter__(self) -> Any: ...
    async def __aexit__(self, *exc: object) -> Any: ...
    def __aiter__(self) -> AsyncIterator[Output]: ...


S = TypeVar("S", bound=Session)


async def run_to_end(session: Session, max_output: int) -> tuple[ExecResult, bytes, bytes]:
    """Read `session` to its end, keeping at most `max_output` bytes of each stream."""
    buffers = {"stdout": bytearray(), "stderr": bytearray()}
    truncated = False
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Command:
    """A command to start in a sandbox: what `exec` takes, on whichever host it runs."""

    argv: list[str]
    env: dict[str, str] | None = None
    cwd: str | None = None
    stdin: bytes | None = None
    timeout: float | None = None
    stdin_open: bool = False  # stdin a pipe kept open for `ExecSession.send_stdin`


class RunsToEnd(Generic[S]):
    """`exec` and `run`, said once for every channel: one starts a `Command` (`launch`), here
    or on another host (`aamp.fleet.link_client`)."""

    async def launch(self, command: Command) -> S:
        raise NotImplementedError

    async def exec(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        stdin_open: bool = False,
    ) -> S:
        """Start a command; returns the live session (iterate it for output). With
        `stdin_open` its stdin is a pipe kept open for `ExecSession.send_stdin`."""
        return await self.launch(
            Command(
                argv=argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout, stdin_open=stdin_open
            )
        )

    async def run(
        self, argv: list[str], *, max_output: int = DEFAULT_MAX_OUTPUT, **options: Any
    ) -> tuple[ExecResult, bytes, bytes]:
        """Run a command to its end (`options` as `exec` takes them); keeps at most
        `max_output` bytes of each stream."""
        return await run_to_end(await self.exec(argv, **options), max_output)


class GuestChannel(ConnectionPool, RunsToEnd[ExecSession]):
    """The host end of one sandbox's guest-agent channel (see `aamp.sandbox.channel`)."""

    async def health(self) -> dict[str, Any]:
        conn = await self._acquire()
        try:
            wire.write_control(conn.writer, {"op": "health"})
            ftype, payload = await self._read(conn, "answering health")
            return parse_health(control(ftype, payload, "in the health answer"))
        finally:
            conn.close(abort=True)

    async def launch(self, command: Command) -> ExecSession:
        argv, stdin, timeout = command.argv, command.stdin, command.timeout
        check_exec_args(argv, command.env, command.cwd, timeout)
        if command.stdin_open and stdin is not None:
            raise ValueError("give stdin's bytes or keep it open, not both")
        if stdin is not None and len(stdin) > self.max_file_bytes:
            raise FileTooLargeError(
                f"stdin is {len(stdin)} bytes, over the limit of {self.max_file_bytes}"
            )
        request = {
            "op": "exec",
            "argv": list(argv),
            "env": dict(command.env or {}),
            "cwd": command.cwd,
            "stdin": stdin is not None or command.stdin_open,
            "timeout": timeout,
            "heartbeat": max(self.limits.io_timeout / 3, 0.05),
        }
        encoded = wire.encode_control(request)
        if len(encoded) > wire.MAX_PAYLOAD:
            raise ValueError(f"exec request is {len(encoded)} bytes, over {wire.MAX_PAYLOAD}")
        conn = await self._acquire()
        session = ExecSession(self, conn, argv[0], timeout)
        wire.write_frame(conn.writer, wire.CONTROL, encoded)
        if stdin is not None:
            if len(stdin) <= wire.MAX_PAYLOAD:
                if stdin:
                    wire.write_frame(conn.writer, wire.STDIN, stdin)
                wire.write_frame(conn.writer, wire.EOF)
            else:
                session._start_stdin(stdin)
        return session

    async def put_file(self, guest_path: str, host_file: Path) -> int:
        """Copy a host file into the guest, read in blocks off the event loop; its size (as
        the open file has it), which is what was sent."""
        with open(host_file, "rb") as f:

            async def blocks() -> AsyncIterator[bytes]:
                while block := await asyncio.to_thread(f.read, 1 << 20):
                    yield block

            size = os.fstat(f.fileno()).st_size
            await self.put(guest_path, blocks(), size)
            return size

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
            wire.write_control(conn.writer, {"op": "put", "path": relative(full), "size": size})
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
            await asyncio.wait({reply}, timeout=self.limits.io_timeout)
            if not reply.done():
                if send_error is not None:
                    raise send_error
                raise GuestTimeout(
                    f"the guest did not confirm within {self.limits.io_timeout:g}s {what}"
                )
        reply_error = reply.exception()
        if reply_error is not None:
            # A guest that stopped reading (send_error) is the cause of the hang-up it sees.
            raise send_error or reply_error
        ftype, payload = reply.result()
        message = control(ftype, payload, f"answering {what}")
        raise_if_error(message, f"put {full}")
        if message.get("ok") is not True or message.get("size") != size:
            raise GuestProtocolError(f"unexpected answer {what}")
        if not sender.done():  # it may still be returning from its last drain
            await asyncio.wait({sender}, timeout=self.limits.io_timeout)
        if not sender.done() or sender.exception() is not None:
            raise GuestProtocolError(f"the guest confirmed before receiving all data {what}")

    async def _send_file(
        self, conn: Conn, source: AsyncIterator[bytes] | bytes, size: int, what: str
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
                {"op": "get", "path": relative(full), "max_size": self.max_file_bytes},
            )
            ftype, payload = await self._read(conn, what)
            message = control(ftype, payload, what)
            raise_if_error(message, f"get {full}")
            size = field(message, "size", "int", what)
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
                    raise_if_error(control(ftype, payload, what), "browser")
                if ftype != wire.DATA:
                    raise GuestProtocolError(f"unexpected {wire.type_name(ftype)} frame {what}")
                size += len(payload)
                if size > max_answer:
                    raise GuestProtocolError(f"the guest sent over {max_answer} bytes {what}")
                chunks.append(payload)
        finally:
            conn.close(abort=True)
