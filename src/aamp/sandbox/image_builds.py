"""What the control plane knows of the image builds it ran (`POST /v1/images/NAME/build`):
the last build of each image — who started it, its progress lines as they come from the
builder's worker thread, how it ended — and a way to wait for its next line. Nothing here
survives a restart; a build's image is in the image store, not here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from aamp.sandbox.images import BuiltImage

# A build that says more than this keeps only its newest lines (a follower who joins late is
# told how many it missed); a line longer than MAX_LINE is cut.
MAX_LINES = 5000
MAX_LINE = 2000


@dataclass(eq=False)
class ImageBuild:
    """One build: who started it, its progress lines (ids from 1), and how it ended."""

    name: str
    by: str
    force: bool
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    lines: list[str] = field(default_factory=list)
    dropped: int = 0  # lines before lines[0] no longer kept
    state: str = "running"  # then "built" or "failed"
    image: dict[str, Any] | None = None
    error: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def last_id(self) -> int:
        return self.dropped + len(self.lines)

    def say(self, line: str) -> None:
        self.lines.append(line[:MAX_LINE])
        if len(self.lines) > MAX_LINES:
            del self.lines[0]
            self.dropped += 1
        self._wake()

    def end(self, image: dict[str, Any] | None, error: str | None) -> None:
        self.state = "built" if error is None else "failed"
        self.image, self.error = image, error
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "by": self.by,
            "force": self.force,
            "started_at": self.started_at.isoformat(),
            "state": self.state,
            "lines": self.last_id,
            "image": self.image,
            "error": self.error,
        }


class ImageBuilds:
    """The builds this control plane ran, the last one of each image."""

    def __init__(self) -> None:
        self._last: dict[str, ImageBuild] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def last(self, name: str) -> ImageBuild | None:
        return self._last.get(name)

    def all(self) -> list[ImageBuild]:
        """The last build of each image, the newest first."""
        return sorted(self._last.values(), key=lambda b: b.started_at, reverse=True)

    def start(
        self,
        build: ImageBuild,
        run: Callable[[Callable[[str], None]], BuiltImage],
        finished: Callable[[ImageBuild], Awaitable[None]],
    ) -> None:
        """Run `run(progress)` in a worker thread, unless a build of that image is running
        (the caller checks `last(name)` first: both happen on the event loop, so nothing
        starts in between)."""
        running = self._last.get(build.name)
        assert running is None or running.state != "running", "one build of an image at a time"
        self._last[build.name] = build
        loop = asyncio.get_running_loop()

        def progress(line: str) -> None:  # called in the worker thread
            loop.call_soon_threadsafe(build.say, line)

        async def go() -> None:
            try:
                image = await anyio.to_thread.run_sync(run, progress)
            except Exception as exc:
                build.end(None, str(exc) or type(exc).__name__)
            else:
                build.end(describe_image(image), None)
            await finished(build)

        task = asyncio.create_task(go(), name=f"image-build-{build.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def describe_image(img: BuiltImage) -> dict[str, Any]:
    """An image as the API shows it (`GET /v1/images`, a build's end)."""
    return {"name": img.name, "hash": img.content_hash, "size_bytes": img.size_bytes,
            "ext4_bytes": img.ext4_bytes, "built_at": img.built_at.isoformat()}  # fmt: skip
