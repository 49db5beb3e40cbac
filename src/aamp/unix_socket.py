"""A private Unix socket to listen on: mode 0600, replacing only a socket left behind.

The guest channel (`sandbox.channel`) and each sandbox's egress proxy (`egress.proxy`) listen
on a socket in the sandbox's state directory. Both replace a stale socket file a previous host
process left behind, refuse to replace a file of any other kind, and on close remove only a
socket. This module imports nothing of aamp, so both may use it.

A connection reset by its peer ends the stream like a close: what the peer sent before it is
still read. A peer that closes with bytes of ours unread resets the connection, and asyncio's
`StreamReader` raises a connection's error before the bytes it holds, so a guest's last
(partial) frame or request would otherwise be lost to whichever loop saw the reset first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _ResetEndsStream(asyncio.StreamReaderProtocol):
    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(None if isinstance(exc, ConnectionResetError) else exc)


async def listen_private(path: Path, serve: Serve, *, limit: int, **options: Any) -> asyncio.Server:
    """Listen on `path` (mode 0600) as `asyncio.start_unix_server(serve, limit=limit,
    **options)` does, but a reset ends a stream like a close (see the module); a socket file
    already there is replaced, anything else refused (`ValueError`)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ValueError(f"{path} exists and is not a socket; refusing to replace it")
        path.unlink()
    loop = asyncio.get_running_loop()

    def connection() -> _ResetEndsStream:
        return _ResetEndsStream(asyncio.StreamReader(limit=limit, loop=loop), serve, loop=loop)

    server = await loop.create_unix_server(connection, path=str(path), **options)
    os.chmod(path, 0o600)
    return server


def stop_listening(server: asyncio.AbstractServer | None, path: Path) -> None:
    """Stop `server` listening (None: it is not) and remove the socket file at `path`, if there
    is one; a file of another kind stays."""
    if server is not None:
        server.close()
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
