"""A file streamed out of a sandbox by a response that outlives the handler starting it: the
sandbox stays borrowed (`SandboxManager.use`, so it is not idle and not given back) from the
moment the file is opened until the stream is closed, once, however the response ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aamp.sandbox.manager import SandboxManager


class HeldDownload:
    """The guest file's chunks (`async for`) and announced `size`; `aclose` drops the guest
    connection and gives the sandbox back."""

    def __init__(self, stream: Any, use: AbstractAsyncContextManager[Any]) -> None:
        self._stream, self._use = stream, use
        self.size: int = stream.size
        self._closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._stream.__aiter__()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._stream.aclose()
        finally:
            await self._use.__aexit__(None, None, None)


async def open_download(manager: SandboxManager, sandbox_id: str, guest_path: str) -> HeldDownload:
    """Borrow the sandbox and open `guest_path` in it; a refusal gives the sandbox back."""
    use = manager.use(sandbox_id)
    channel = await use.__aenter__()
    try:
        stream = await channel.get(guest_path)
    except BaseException:
        await use.__aexit__(None, None, None)
        raise
    return HeldDownload(stream, use)
