"""Image builds over the API (admins; `aamp image build`'s twin): start one, and follow its
progress as server-sent events.

A build runs in a worker thread (`ImageStore.build`, the same call as the CLI's, trusting the
installation's CA); its progress is kept in the control plane's `ImageBuilds`
(`aamp.sandbox.image_builds`), so any number of followers — a reloaded page, a second admin —
see the whole build from its first line and then live. One build of an image at a time: a
second one while it runs is refused (409, on record) and pointed at the running one.

The guard records the start (`image.build`); the end is recorded as `image.build_finished`
with the hash and size built, or the reason it failed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import StreamingResponse

from aamp.api.body import Body
from aamp.api.errors import ApiError
from aamp.api.guard import actor_of, cp_of, guarded_router, record_refusal, request_id, rule
from aamp.egress.ca import ca_cert_path
from aamp.sandbox import BuiltImage, ImageBuild, ImageBuilds

ImageName = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")]
KEEPALIVE_SECONDS = 15.0


class BuildIn(Body):
    force: bool = False


def _event(event: str, data: dict[str, Any], event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["images"])

    @r.post("/images/{name}/build", status_code=202)
    @rule("image.build")
    async def build_image(name: ImageName, body: BuildIn, request: Request) -> dict[str, Any]:
        """Start building an image (cached by content hash; `force` rebuilds); follow it at
        `GET /v1/images/{name}/build/events`. 409 while a build of it runs."""
        cp, actor = cp_of(request), actor_of(request)
        builds: ImageBuilds = cp.builds
        if name not in cp.images.names():
            raise ApiError(
                404, "not_found", f"unknown image {name!r}: one of {', '.join(cp.images.names())}"
            )
        running = builds.last(name)
        if running is not None and running.state == "running":
            reason = (
                f"image {name!r} is already being built (started by {running.by} at "
                f"{running.started_at:%Y-%m-%d %H:%M:%SZ}): one build of an image at a time; "
                f"follow it at /v1/images/{name}/build/events"
            )
            await record_refusal(request, "image.build", f"image:{name}", reason)
            raise ApiError(409, "build_running", reason)
        build = ImageBuild(name, actor.audit_name, body.force)
        settings, images, rid = cp.settings, cp.images, request_id(request)

        def run(progress: Callable[[str], None]) -> BuiltImage:
            return images.build(
                name, progress=progress, force=body.force, ca_cert=ca_cert_path(settings)
            )

        async def finished(done: ImageBuild) -> None:
            details = {"force": done.force, "lines": done.last_id}
            if done.image is not None:
                details |= {k: done.image[k] for k in ("hash", "size_bytes", "ext4_bytes")}
            await cp.audit.record(
                actor=done.by,
                action="image.build_finished",
                resource=f"image:{name}",
                decision="allow" if done.error is None else "error",
                reason=done.error[:1000] if done.error else None,
                request_id=rid,
                details=details,
            )

        builds.start(build, run, finished)
        return build.describe()

    @r.get("/image-builds")
    @rule("image.build_read")
    async def list_builds(request: Request) -> list[dict[str, Any]]:
        """The last build of each image since the control plane started, the newest first."""
        return [b.describe() for b in cp_of(request).builds.all()]

    @r.get("/images/{name}/build")
    @rule("image.build_read")
    async def show_build(name: ImageName, request: Request) -> dict[str, Any]:
        """The last build of an image since the control plane started (404 if none)."""
        return _last_build(request, name).describe()

    @r.get(
        "/images/{name}/build/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    @rule("image.build_read")
    async def build_events(name: ImageName, request: Request) -> StreamingResponse:
        """The last build's progress as server-sent events (`progress`, one line each, from the
        first; live while it runs), then `finished` with the image built or the error. Resume
        with `Last-Event-ID`."""
        build = _last_build(request, name)
        last = request.headers.get("last-event-id", "")
        seen = int(last) if last.isdigit() else 0

        async def stream() -> AsyncIterator[bytes]:
            nonlocal seen
            while True:
                changed = build.changed
                if seen < build.dropped:
                    yield _event("progress", {"line": f"({build.dropped - seen} earlier lines "
                                              "not kept)"})  # fmt: skip
                    seen = build.dropped
                for n in range(seen + 1, build.last_id + 1):
                    yield _event("progress", {"line": build.lines[n - build.dropped - 1]}, n)
                seen = build.last_id
                if build.state != "running":
                    yield _event("finished", build.describe())
                    return
                if await request.is_disconnected():
                    return
                try:
                    await asyncio.wait_for(changed.wait(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    yield b": keep-alive\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    return r


def _last_build(request: Request, name: str) -> ImageBuild:
    build = cp_of(request).builds.last(name)
    if build is None:
        raise ApiError(
            404,
            "not_found",
            f"no build of image {name!r} since the control plane started: start one with "
            f"POST /v1/images/{name}/build",
        )
    return build
