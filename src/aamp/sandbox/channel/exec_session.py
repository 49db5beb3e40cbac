"""One command running in the guest: its output as it comes, its result, its kill.

The host bounds every wait: past the command's timeout plus the grace period it stops waiting,
tells the guest to kill the process group and hangs up, and reports the command timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Literal

from aamp.guest import wire
from aamp.sandbox.channel.errors import (
    ChannelError,
    GuestProtocolError,
    GuestTimeout,
    GuestUnavailable,
)
from aamp.sandbox.channel.messages import control, field, raise_if_error
from aamp.sandbox.channel.pool import Conn, ConnectionPool, HoldsConnection


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


class ExecSession(HoldsConnection):
    """One running command. Iterate it for `Output` as it arrives; when iteration ends,
    `result` is set. Leaving the `async with` block early kills the command."""

    def __init__(
        self,
        channel: ConnectionPool,
        conn: Conn,
        argv0: str,
        timeout: float | None,
    ) -> None:
        """Made as the exec request goes out: the command's clock starts here."""
        self._started = time.monotonic()
        self._channel = channel
        self._conn = conn
        self._argv0 = argv0
        self._timeout = timeout
        # Past this instant the host stops waiting for the guest to end the command.
        self._hard_deadline = (
            self._started + timeout + channel.limits.exec_grace if timeout else None
        )
        self._killed = False
        self._stdin_task: asyncio.Task[None] | None = None
        self.result: ExecResult | None = None

    def _start_stdin(self, data: bytes) -> None:
        self._stdin_task = asyncio.create_task(self._send_stdin(data))

    async def _send_stdin(self, data: bytes) -> None:
        try:
            await self.send_stdin(data)
            wire.write_frame(self._conn.writer, wire.EOF)
        except (ChannelError, ConnectionError, RuntimeError):
            pass  # the exec's own reads report what happened to the connection

    async def send_stdin(self, data: bytes) -> None:
        """More bytes for the command's stdin (started with `stdin_open`)."""
        if self.result is not None or self._conn.closed:
            raise GuestUnavailable(f"{self._argv0} has ended: its stdin is closed")
        view = memoryview(data)
        for start in range(0, len(view), wire.DATA_CHUNK):
            wire.write_frame(self._conn.writer, wire.STDIN, view[start : start + wire.DATA_CHUNK])
            await self._channel._drain(self._conn, "sending stdin")

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
            message = control(ftype, payload, "during exec")
            if message.get("keepalive") is True and len(message) == 1:
                continue
            raise_if_error(message, f"exec {self._argv0}")
            self._finish(self._parse_result(message))
        raise StopAsyncIteration

    async def _next_frame(self) -> tuple[int, bytes]:
        channel = self._channel
        limit = channel.limits.io_timeout
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
                    f"the guest did not confirm the kill within {channel.limits.exec_grace:g}s"
                ) from None
            # The guest did not end the command in time: the host ends it.
            self._finish(ExecResult(None, None, True, time.monotonic() - self._started))
            return wire.CONTROL, b""

    def _past_timeout(self) -> bool:
        assert self._timeout is not None
        return time.monotonic() >= self._started + self._timeout

    def _parse_result(self, message: dict[str, Any]) -> ExecResult:
        what = "in the exec result"
        exit_code = field(message, "exit_code", "int?", what)
        signal = field(message, "signal", "int?", what)
        timed_out = field(message, "timed_out", "bool", what)
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
        deadline = time.monotonic() + self._channel.limits.exec_grace
        if self._hard_deadline is None or deadline < self._hard_deadline:
            self._hard_deadline = deadline

    async def wait(self) -> ExecResult:
        """Discard remaining output and return the result."""
        async for _ in self:
            pass
        assert self.result is not None
        return self.result

    async def aclose(self) -> None:
        """Let the connection go; a command still running is killed (process group)."""
        if self.result is None and not self._conn.closed:
            # Closing the connection makes the guest kill the process group too.
            self._send_kill()
            self._conn.close()
        if self._stdin_task is not None and not self._stdin_task.done():
            self._stdin_task.cancel()
