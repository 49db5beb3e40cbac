"""A file coming out of the guest: the announced size checked before the first byte, then held."""

from __future__ import annotations

from aamp.guest import wire
from aamp.sandbox.channel.errors import GuestProtocolError
from aamp.sandbox.channel.messages import control, raise_if_error
from aamp.sandbox.channel.pool import Conn, ConnectionPool, HoldsConnection


class GetStream(HoldsConnection):
    """A file coming out of the guest: `size` is known and checked against the limit before
    the first chunk; iteration yields chunks and fails if the guest sends more or fewer bytes
    than it announced. Use as `async with` (or call `aclose`) to drop the connection early."""

    def __init__(self, channel: ConnectionPool, conn: Conn, path: str, size: int) -> None:
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
            message = control(ftype, payload, what)
            raise_if_error(message, f"get {self.path}")
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
