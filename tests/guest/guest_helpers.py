"""Helpers for the guest agent and channel tests (a module of its own, so that importing it
never depends on which `conftest` pytest loaded last)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aamp.guest import wire
from aamp.sandbox import ChannelLimits, GuestChannel

MiB = 1024 * 1024

AgentStarter = Callable[..., subprocess.Popen[bytes]]


def make_channel(
    sock_path: Path, *, max_file_bytes: int = 200 * MiB, **limits: Any
) -> GuestChannel:
    """A channel with short waits; `limits` are `ChannelLimits` fields that replace them."""
    options: dict[str, Any] = {"hello_timeout": 2.0, "io_timeout": 5.0, "exec_grace": 1.0}
    options.update(limits)
    return GuestChannel(sock_path, max_file_bytes=max_file_bytes, limits=ChannelLimits(**options))


class HostileGuestForTests:
    """A test double for a compromised guest agent: it dials the host channel like the real
    agent does and then sends exactly what a test tells it to (garbage, lies, silence)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, path: Path, *, hello: bool = True) -> HostileGuestForTests:
        reader, writer = await asyncio.open_unix_connection(str(path))
        guest = cls(reader, writer)
        if hello:
            guest.send_control(
                {"hello": "aamp-guest", "protocol": wire.PROTOCOL_VERSION, "version": "x", "pid": 7}
            )
        return guest

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def send_frame(self, ftype: int, payload: bytes = b"") -> None:
        self.writer.write(wire.HEADER.pack(len(payload), ftype) + payload)

    def send_control(self, obj: dict[str, Any]) -> None:
        self.send_frame(wire.CONTROL, wire.encode_control(obj))

    async def read_request(self, timeout: float = 5.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            ftype, payload = await wire.read_frame(
                self.reader, max_payload=wire.MAX_PAYLOAD, max_control=wire.MAX_PAYLOAD
            )
        assert ftype == wire.CONTROL
        return wire.decode_control(payload)

    async def read_frame(self, timeout: float = 5.0) -> tuple[int, bytes]:
        async with asyncio.timeout(timeout):
            return await wire.read_frame(
                self.reader, max_payload=wire.MAX_PAYLOAD, max_control=wire.MAX_PAYLOAD
            )

    async def wait_hung_up(self, timeout: float = 5.0) -> None:
        """Return once the host has closed this connection (reading and dropping anything
        it still sends)."""
        async with asyncio.timeout(timeout):
            try:
                while await self.reader.read(65536):
                    pass
            except ConnectionError:
                pass  # a reset (we wrote after the host closed) is a hang-up too

    def close(self) -> None:
        self.writer.transport.abort()


def alive(pid: int) -> bool:
    """A process counts as gone once it is dead or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def pids_gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.02)
    return not any(alive(p) for p in pids)
