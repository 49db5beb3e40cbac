"""A private Unix socket to listen on: mode 0600, replacing only a socket left behind.

The guest channel (`sandbox.channel`) and each sandbox's egress proxy (`egress.proxy`) listen
on a socket in the sandbox's state directory. Both replace a stale socket file a previous host
process left behind, refuse to replace a file of any other kind, and on close remove only a
socket. This module imports nothing of aamp, so both may use it.
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


async def listen_private(path: Path, serve: Serve, **options: Any) -> asyncio.Server:
    """Listen on `path` (mode 0600) with `asyncio.start_unix_server(serve, **options)`; a
    socket file already there is replaced, anything else refused (`ValueError`)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ValueError(f"{path} exists and is not a socket; refusing to replace it")
        path.unlink()
    server = await asyncio.start_unix_server(serve, path=str(path), **options)
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
