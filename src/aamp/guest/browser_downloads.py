"""Downloads a page starts: saved as /workspace/downloads/NAME under a safe name, never
overwriting, and reported with their name, size and type (or why they failed).

Runs inside the guest (the browser driver process); standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import mimetypes
import os
import re

from aamp.guest.browser_targets import first_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DOWNLOAD_DIR = "downloads"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]")


def safe_download_name(suggested: str) -> str:
    """A file name that is safe in /workspace/downloads and usable as an artifact name."""
    name = os.path.basename(suggested.replace("\\", "/")).strip()
    name = _UNSAFE_NAME.sub("_", name).lstrip(" .") or "download"
    stem, ext = os.path.splitext(name)
    return stem[: 200 - len(ext[:20])] + ext[:20]


def claim(folder: str, name: str) -> str:
    """A path in `folder` for `name` that no file has yet ('a.csv', 'a (2).csv', ...)."""
    stem, ext = os.path.splitext(name)
    for n in itertools.count(1):
        candidate = os.path.join(folder, name if n == 1 else f"{stem} ({n}){ext}")
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")


async def save_download(
    workspace: str, tab: str, download: Any, event: Callable[[dict[str, Any]], None]
) -> None:
    """Save `download` (Playwright's) as /workspace/downloads/NAME and report it to `event`,
    or report why it failed."""
    folder = os.path.join(workspace, DOWNLOAD_DIR)
    name = safe_download_name(download.suggested_filename or "")
    try:
        os.makedirs(folder, exist_ok=True)
        path = claim(folder, name)
        await download.save_as(path)
    except Exception as exc:
        reason = None
        with contextlib.suppress(Exception):
            reason = await download.failure()
        event(
            {
                "kind": "download_failed",
                "tab": tab,
                "name": name,
                "url": download.url[:500],
                "error": reason or first_line(exc),
            }
        )
        return
    stored = os.path.basename(path)
    event(
        {
            "kind": "download",
            "tab": tab,
            "path": f"{DOWNLOAD_DIR}/{stored}",
            "name": stored,
            "size": os.path.getsize(path),
            "type": mimetypes.guess_type(stored)[0] or "application/octet-stream",
            "url": download.url[:500],
        }
    )
    with contextlib.suppress(Exception):
        await download.delete()
