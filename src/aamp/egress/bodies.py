"""Moving message bodies between the guest and an upstream, each byte counted once.

A body is delimited by its framing (`http1.Framing`): so many bytes (`copy_length`; a large
one is spliced, see `splice.py`), chunked (`copy_chunked`: every piece of framing is checked
by `http1.chunked_framing` before it is passed on; chunk data is opaque and may be spliced),
or until the source ends (`pump`). `pieces` yields a body with its framing removed, for the
scrubber. Every byte written goes through the sandbox's `Meter` (counts and `max_bytes_out`).

A chunked *request* body is first held (`hold_chunked`): read and checked up to
`ProxyLimits.held_body_bytes` before anything of the request — its head included — is sent,
so a malformed body that fits never reaches the upstream at all. A longer body is sent as far
as it was checked and continues in checked pieces; if it turns malformed later, the upstream
has received a valid prefix of an unfinished request, never a malformed byte, and the
connection to it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aamp.egress import splice
from aamp.egress.http1 import ChunkData, Framing, Refusal, chunked_framing
from aamp.egress.limits import ProxyLimits
from aamp.egress.meter import Attempt, Meter

# A scrubbed body is read, scrubbed and sent in pieces of at most this size. Larger pieces
# cost fewer Python steps each, but objects over the allocator's 128 KiB mmap threshold are
# fresh pages every time (a page fault per 4 KiB, the zeroing and the unmap: measured, 1 MiB
# pieces cost the proxy more CPU per byte than 64 KiB ones on a TLS service download).
SCRUBBED_PIECE = 64 * 1024


@dataclass
class HeldBody:
    """The checked start of a chunked request body. `rest` (None: the body is complete) walks
    on from where holding stopped, `pending` data bytes of the current chunk first."""

    data: bytes
    rest: AsyncIterator[bytes | ChunkData] | None = None
    pending: int = 0


class Bodies:
    def __init__(self, limits: ProxyLimits, meter: Meter):
        self.limits = limits
        self.meter = meter

    async def hold_chunked(self, source: asyncio.StreamReader) -> HeldBody:
        """Read and check a chunked request body, up to `held_body_bytes` of it."""
        limit = self.limits.held_body_bytes
        walker = chunked_framing(source, self.limits, from_upstream=False)
        held = bytearray()
        try:
            async for piece in walker:
                if isinstance(piece, ChunkData):
                    take = min(piece.size, max(0, limit - len(held)))
                    if take:
                        held += await source.readexactly(take)
                    if take < piece.size:
                        return HeldBody(bytes(held), walker, piece.size - take)
                else:
                    held += piece
                    if len(held) >= limit:
                        return HeldBody(bytes(held), walker)
        except asyncio.IncompleteReadError as exc:
            raise Refusal(
                400,
                "client: incomplete body",
                f"the client ended the connection {len(held) + len(exc.partial)} bytes into "
                "a chunked body; nothing of it was sent",
            ) from None
        return HeldBody(bytes(held))

    async def copy_chunked(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        attempt: Attempt,
        *,
        up: bool,
        source_writer: asyncio.StreamWriter | None = None,
        held: HeldBody | None = None,
    ) -> None:
        """Forward a chunked body verbatim while checking it (`held`: continue one whose
        start was held and already sent). A large chunk's data may be spliced."""
        if held is not None and held.rest is None:
            return

        async def data(size: int) -> None:
            await self.copy_length(source, sink, size, attempt, up=up, source_writer=source_writer)

        if held is not None:
            if held.pending:
                await data(held.pending)
            walker = held.rest
        else:
            walker = chunked_framing(source, self.limits, from_upstream=not up)
        send = self.meter.sender(up=up)
        async for piece in walker:
            if isinstance(piece, ChunkData):
                await data(piece.size)
            else:
                send(sink, piece, attempt)
        await sink.drain()

    async def copy_length(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        length: int,
        attempt: Attempt,
        *,
        up: bool,
        source_writer: asyncio.StreamWriter | None = None,
        head: bytes = b"",
    ) -> None:
        """Forward exactly `length` body bytes, after the message `head` if one is given (it
        goes out in the same write as the first bytes of a copied body). With the source's
        writer (its transport) given and both ends plain sockets, a large body is spliced
        (`splice_body`)."""
        send = self.meter.sender(up=up)
        if source_writer is not None and length >= splice.MIN_BODY:
            if head:
                send(sink, head, attempt)
                head = b""
            if await self.splice_body(source, source_writer, sink, attempt, up=up, length=length):
                return
        remaining = length
        size = self.limits.chunk_bytes
        while remaining:  # a plain loop: most bodies are small, and this is every request's
            data = await source.read(min(size, remaining))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            if head:
                data, head = head + data, b""
            send(sink, data, attempt)
            await sink.drain()
        if head:  # an empty body
            send(sink, head, attempt)

    async def splice_body(
        self,
        source: asyncio.StreamReader,
        source_writer: asyncio.StreamWriter,
        sink: asyncio.StreamWriter,
        attempt: Attempt,
        *,
        up: bool,
        length: int | None,
    ) -> bool:
        """Forward a body of `length` bytes (None: until the source ends) with splice(2), the
        request/response heads around it staying with the streams and the parser. False
        (nothing moved) if either end is not a plain socket or the body is already buffered.

        What the source's reader had buffered goes first, through the same accounting as the
        copy path; the sink's buffer is emptied before the first spliced byte."""
        if not splice.available():
            return False
        src = splice.plain_socket(source_writer)
        dst = splice.plain_socket(sink)
        ahead = splice.read_ahead(source)
        if src is None or dst is None or ahead is None:
            return False
        if length is not None and length - len(ahead) < splice.MIN_BODY:
            return False  # (nearly) all buffered already: a copy is cheaper
        meter = self.meter
        with splice.reading_paused(source, source_writer.transport):
            if ahead:
                data = bytes(ahead)
                ahead.clear()
                meter.sender(up=up)(sink, data, attempt)
                if length is not None:
                    length -= len(data)
            await splice.flushed(sink)
            with splice.owned_fd(src) as src_fd, splice.owned_fd(dst) as dst_fd:
                await splice.move(
                    src_fd,
                    dst_fd,
                    length=length,
                    room=meter.room(up=up),
                    count=lambda n: meter.count(attempt, n, up=up),
                )
        return True

    async def pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        attempt: Attempt,
        *,
        up: bool,
    ) -> None:
        """Copy until EOF (passed on as a half-close), counting each byte."""
        send = self.meter.sender(up=up)
        size = self.limits.chunk_bytes
        while True:
            data = await source.read(size)
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    if sink.can_write_eof():
                        sink.write_eof()
                return
            send(sink, data, attempt)
            await sink.drain()

    async def pieces(self, source: asyncio.StreamReader, framing: Framing) -> AsyncIterator[bytes]:
        """An upstream body's bytes, framing removed (trailers are checked and dropped), in
        pieces of at most `SCRUBBED_PIECE` bytes."""
        size = SCRUBBED_PIECE
        if framing.kind == "length":
            async for data in _exactly(source, framing.length, size):
                yield data
        elif framing.kind == "eof":
            while data := await source.read(size):
                yield data
        elif framing.kind == "chunked":
            async for piece in chunked_framing(source, self.limits, from_upstream=True):
                if isinstance(piece, ChunkData):
                    async for data in _exactly(source, piece.size, size):
                        yield data


async def _exactly(source: asyncio.StreamReader, length: int, size: int) -> AsyncIterator[bytes]:
    remaining = length
    while remaining:
        data = await source.read(min(size, remaining))
        if not data:
            raise asyncio.IncompleteReadError(b"", remaining)
        remaining -= len(data)
        yield data
