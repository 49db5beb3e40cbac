"""The one rule for a guest path a caller may name: inside /workspace, within the kernel's limits.

The API, the agents' tools and the channel's put/get all refuse with the same words here,
before anything reaches the guest.
"""

from __future__ import annotations

import posixpath

WORKSPACE = "/workspace"
MAX_GUEST_PATH_BYTES = 4096
MAX_NAME_BYTES = 255


class PathEscapeError(ValueError):
    """A guest path that is not inside /workspace (or is not a usable path at all)."""


def workspace_path(path: str) -> str:
    """Normalise a guest path for put/get to an absolute path inside /workspace.

    Relative paths are relative to /workspace. Refuses (with `PathEscapeError`) anything that
    leaves it lexically (``..``, absolute paths elsewhere), NUL bytes, non-UTF-8, and paths or
    names over the kernel's limits. Symlinks inside the guest are the agent's to check: it
    resolves with realpath and refuses anything that lands outside.
    """
    if not isinstance(path, str):
        raise PathEscapeError(f"guest path must be a string, not {type(path).__name__}")
    if not path:
        raise PathEscapeError("guest path is empty")
    if "\x00" in path:
        raise PathEscapeError("guest path contains a NUL byte")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise PathEscapeError("guest path is not valid UTF-8") from None
    if len(encoded) > MAX_GUEST_PATH_BYTES:
        raise PathEscapeError(
            f"guest path is {len(encoded)} bytes, over the limit of {MAX_GUEST_PATH_BYTES}"
        )
    full = posixpath.normpath(posixpath.join(WORKSPACE, path))
    if full.startswith("//"):  # normpath keeps a leading "//"
        full = "/" + full.lstrip("/")
    if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
        raise PathEscapeError(f"guest path {path!r} is outside {WORKSPACE}")
    for name in full.split("/"):
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise PathEscapeError(
                f"guest path has a name over {MAX_NAME_BYTES} bytes: {name[:40]!r}..."
            )
    return full


def relative(full: str) -> str:
    """What the agent receives: the path relative to its workspace root."""
    return posixpath.relpath(full, WORKSPACE)
