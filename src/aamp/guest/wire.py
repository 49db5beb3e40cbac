"""Framing of the guest-agent channel, shared by the guest agent and the host.

One connection carries one request. Both directions are a sequence of frames::

    frame = length (4 bytes, big-endian, payload only) + type (1 byte) + payload

Types: CONTROL (a JSON object), STDOUT / STDERR (process output, guest -> host), STDIN
(process input, host -> guest), DATA (file bytes, either way) and EOF (end of a STDIN or DATA
stream; empty payload). The header is checked *before* the payload is read or allocated: an
unknown type, a payload over the limit for its type, or an EOF with a payload is a
`ProtocolError`, and so is a connection that ends inside a frame. A connection that ends
cleanly between frames raises `ConnectionClosed` instead, so callers can tell "the peer went
away" from "the peer sent garbage".

The host never trusts the guest: it reads guest frames with `max_control=MAX_GUEST_CONTROL`
and validates every decoded object field by field (see `aamp.sandbox.channel`).

Standard library only (this module also runs inside the guest). The asyncio helpers only use
`StreamReader.readexactly` / `StreamWriter.write`, so importing this module does not import
asyncio (which would slow the guest agent's start).
"""

from __future__ import annotations

import json
import math
import struct
from enum import IntEnum

# `typing` is not imported at run time: in a gVisor guest every module imported adds to the
# agent's start-up, which every cold sandbox waits for.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    class _Reader(Protocol):
        async def readexactly(self, n: int) -> bytes: ...

    class _Writer(Protocol):
        def write(self, data: bytes | bytearray | memoryview) -> None: ...


PROTOCOL_VERSION = 1

HEADER = struct.Struct(">IB")
HEADER_SIZE = HEADER.size

# Hard ceiling for any frame payload; file data and output are chunked below it.
MAX_PAYLOAD = 1024 * 1024
# Control messages the guest sends are small (hello, results, errors); the host reads them
# with this lower limit so a hostile guest cannot make it parse megabytes of JSON.
MAX_GUEST_CONTROL = 64 * 1024
# Chunk size for file data (both directions).
DATA_CHUNK = 512 * 1024


class FrameType(IntEnum):
    CONTROL = 1
    STDOUT = 2
    STDERR = 3
    STDIN = 4
    DATA = 5
    EOF = 6


CONTROL = int(FrameType.CONTROL)
STDOUT = int(FrameType.STDOUT)
STDERR = int(FrameType.STDERR)
STDIN = int(FrameType.STDIN)
DATA = int(FrameType.DATA)
EOF = int(FrameType.EOF)
_TYPES = frozenset(int(t) for t in FrameType)


class ProtocolError(Exception):
    """The peer sent something that is not a well-formed frame or message."""


class ConnectionClosed(EOFError):
    """The peer closed the connection cleanly, between two frames."""


def type_name(ftype: int) -> str:
    return FrameType(ftype).name if ftype in _TYPES else f"unknown({ftype})"


def parse_header(header: bytes, *, max_payload: int, max_control: int) -> tuple[int, int]:
    """Check a frame header before anything is allocated for its payload."""
    length, ftype = HEADER.unpack(header)
    if ftype not in _TYPES:
        raise ProtocolError(f"unknown frame type {ftype}")
    limit = max_control if ftype == CONTROL else max_payload
    if length > limit:
        raise ProtocolError(
            f"{type_name(ftype)} frame claims {length} bytes, over the limit of {limit}"
        )
    if ftype == EOF and length:
        raise ProtocolError(f"EOF frame carries {length} bytes of payload")
    return ftype, length


def encode_control(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def decode_control(payload: bytes | bytearray) -> dict[str, Any]:
    """Decode a CONTROL payload into a JSON object; anything else is a `ProtocolError`."""
    try:
        obj = json.loads(bytes(payload).decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"control message is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"control message is a JSON {type(obj).__name__}, not an object")
    return obj


def is_finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- blocking sockets (the guest agent) ---------------------------------------------------


def recv_exact(sock: Any, n: int) -> bytearray:
    """Read exactly `n` bytes; `ConnectionClosed` if the peer closed before the first byte,
    `ProtocolError` if it closed part-way."""
    buf = bytearray(n)
    view = memoryview(buf)
    pos = 0
    while pos < n:
        got = sock.recv_into(view[pos:])
        if got == 0:
            if pos == 0:
                raise ConnectionClosed("connection closed")
            raise ProtocolError(f"connection closed after {pos} of {n} bytes")
        pos += got
    return buf


def recv_frame(
    sock: Any, *, max_payload: int = MAX_PAYLOAD, max_control: int = MAX_PAYLOAD
) -> tuple[int, bytearray]:
    header = recv_exact(sock, HEADER_SIZE)
    ftype, length = parse_header(header, max_payload=max_payload, max_control=max_control)
    if not length:
        return ftype, bytearray()
    try:
        return ftype, recv_exact(sock, length)
    except ConnectionClosed:
        raise ProtocolError(f"connection closed inside a {type_name(ftype)} frame") from None


def frame_parts(ftype: int, payload: bytes | bytearray | memoryview = b"") -> tuple[Any, ...]:
    """One frame as the pieces to write, in order: header and payload joined when small (one
    write), apart when large (no copy of a big payload). ValueError over MAX_PAYLOAD."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    header = HEADER.pack(len(payload), ftype)
    if len(payload) <= 65536:
        return (header + bytes(payload),)
    return (header, payload)


def send_frame(sock: Any, ftype: int, payload: bytes | bytearray | memoryview = b"") -> None:
    for part in frame_parts(ftype, payload):
        sock.sendall(part)


def send_control(sock: Any, obj: dict[str, Any]) -> None:
    send_frame(sock, CONTROL, encode_control(obj))


# --- asyncio streams (the host) --------------------------------------------------------------


async def read_frame(
    reader: _Reader, *, max_payload: int = MAX_PAYLOAD, max_control: int = MAX_GUEST_CONTROL
) -> tuple[int, bytes]:
    """Read one frame from an asyncio StreamReader. `asyncio.IncompleteReadError` is an
    EOFError, so it is caught here without importing asyncio."""
    try:
        header = await reader.readexactly(HEADER_SIZE)
    except EOFError as exc:
        partial = getattr(exc, "partial", b"")
        if partial:
            raise ProtocolError(
                f"connection closed after {len(partial)} bytes of a frame header"
            ) from None
        raise ConnectionClosed("connection closed") from None
    ftype, length = parse_header(header, max_payload=max_payload, max_control=max_control)
    if not length:
        return ftype, b""
    try:
        return ftype, await reader.readexactly(length)
    except EOFError as exc:
        got = len(getattr(exc, "partial", b""))
        raise ProtocolError(
            f"connection closed after {got} of {length} bytes of a {type_name(ftype)} frame"
        ) from None


def write_frame(writer: _Writer, ftype: int, payload: bytes | bytearray | memoryview = b"") -> None:
    """Queue one frame on an asyncio StreamWriter (the caller drains)."""
    for part in frame_parts(ftype, payload):
        writer.write(part)


def write_control(writer: _Writer, obj: dict[str, Any]) -> None:
    write_frame(writer, CONTROL, encode_control(obj))
