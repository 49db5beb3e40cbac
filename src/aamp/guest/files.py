"""Files in and out of the workspace: every path resolved with realpath and kept inside it, a
file written whole or not at all, a file read only if it is a regular one within the limit."""

from __future__ import annotations

import contextlib
import os
import socket
import stat

from aamp.guest import wire
from aamp.guest.errors import RequestError

TYPE_CHECKING = False  # typing is not imported at run time (see `aamp.guest.agent`)
if TYPE_CHECKING:
    from typing import Any

MAX_PATH_BYTES = 4096


def resolve(workspace: str, path: object) -> str:
    """The real path of `path` in the workspace; a NUL, an over-long path or a symlink that
    leads out is refused."""
    if not isinstance(path, str) or not path:
        raise RequestError("bad_path", "path must be a non-empty string")
    if "\x00" in path or len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise RequestError("bad_path", "path contains a NUL byte or is too long")
    real = os.path.realpath(os.path.join(workspace, path))
    if real != workspace and not real.startswith(workspace + os.sep):
        raise RequestError("path_escape", f"{path!r} resolves outside the workspace")
    return real


def put(conn: socket.socket, request: dict[str, Any], workspace: str) -> None:
    """Write a file: into a temporary file next to it, renamed only once exactly the declared
    number of bytes arrived."""
    path = resolve(workspace, request.get("path"))
    size = request.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise RequestError("bad_request", "size must be a non-negative integer")
    shown = request.get("path")
    if os.path.isdir(path):
        raise RequestError("is_directory", f"{shown!r} is a directory")
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise RequestError("bad_path", f"cannot create the folder for {shown!r}: {exc}") from None
    tmp = os.path.join(parent, f".aamp-put-{os.urandom(8).hex()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644)
    except OSError as exc:
        raise RequestError("write_failed", f"cannot write {shown!r}: {exc}") from None
    received = 0
    try:
        try:
            while True:
                ftype, data = wire.recv_frame(conn)
                if ftype == wire.EOF:
                    break
                if ftype != wire.DATA:
                    raise RequestError(
                        "bad_request", f"unexpected {wire.type_name(ftype)} frame in put"
                    )
                received += len(data)
                if received > size:
                    raise RequestError(
                        "size_mismatch",
                        f"received more than the declared {size} bytes; nothing was written",
                    )
                _write_all(fd, data)
        finally:
            os.close(fd)
        if received != size:
            raise RequestError(
                "size_mismatch",
                f"received {received} bytes but {size} were declared; nothing was written",
            )
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
            raise RequestError("write_failed", f"cannot write {shown!r}: {exc}") from None
        raise
    wire.send_control(conn, {"ok": True, "size": received})


def get(conn: socket.socket, request: dict[str, Any], workspace: str) -> None:
    """Send a regular file: its size first (refused over `max_size`), the data, then EOF."""
    path = resolve(workspace, request.get("path"))
    shown = request.get("path")
    max_size = request.get("max_size")
    if not isinstance(max_size, int) or isinstance(max_size, bool) or max_size < 0:
        raise RequestError("bad_request", "max_size must be a non-negative integer")
    try:
        # O_NONBLOCK: opening a FIFO must not hang; O_NOFOLLOW: the path was resolved.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise RequestError("not_found", f"{shown!r} does not exist") from None
    except OSError as exc:
        raise RequestError("read_failed", f"cannot read {shown!r}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise RequestError("is_directory", f"{shown!r} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise RequestError("not_a_file", f"{shown!r} is not a regular file")
        size = st.st_size
        if size > max_size:
            raise RequestError(
                "too_large", f"{shown!r} is {size} bytes, over the limit of {max_size} bytes"
            )
        os.set_blocking(fd, True)
        wire.send_control(conn, {"size": size})
        remaining = size
        while remaining:
            chunk = os.read(fd, min(wire.DATA_CHUNK, remaining))
            if not chunk:
                wire.send_control(
                    conn, {"error": f"{shown!r} shrank while being read", "code": "changed"}
                )
                return
            wire.send_frame(conn, wire.DATA, chunk)
            remaining -= len(chunk)
        wire.send_frame(conn, wire.EOF)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
