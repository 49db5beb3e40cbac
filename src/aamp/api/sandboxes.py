"""Routes for sandboxes and images: create, list, exec (streamed), files in and out, destroy."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from aamp.api.errors import ApiError
from aamp.sandbox import channel as ch
from aamp.sandbox.driver import MiB, Resources
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import (
    DEFAULT_IDLE_SECONDS,
    DEFAULT_TTL_SECONDS,
    CreateRequest,
    SandboxManager,
)

MAX_STDIN_BYTES = 16 * MiB
MAX_ARGV_ITEMS = 4096


class ResourcesIn(BaseModel):
    cpus: float = 1.0
    memory_bytes: int = Resources().memory_bytes
    pids: int = Resources().pids
    disk_bytes: int = Resources().disk_bytes


class SandboxIn(BaseModel):
    image: str = Field("base", min_length=1, max_length=64)
    driver: str | None = Field(None, max_length=32)
    ttl_seconds: float = DEFAULT_TTL_SECONDS
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    resources: ResourcesIn | None = None


class ExecIn(BaseModel):
    argv: list[str] = Field(min_length=1, max_length=MAX_ARGV_ITEMS)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    stdin_b64: str | None = None
    timeout_seconds: float | None = Field(None, gt=0, le=24 * 3600)


def router(manager: SandboxManager, images: ImageStore) -> APIRouter:
    r = APIRouter(prefix="/v1")

    @r.get("/images")
    async def list_images() -> list[dict[str, object]]:
        return [
            {
                "name": img.name,
                "hash": img.content_hash,
                "size_bytes": img.size_bytes,
                "ext4_bytes": img.ext4_bytes,
                "built_at": img.built_at.isoformat(),
            }
            for img in images.list()
        ]

    @r.post("/sandboxes", status_code=201)
    async def create_sandbox(body: SandboxIn) -> dict[str, object]:
        try:
            resources = Resources(**body.resources.model_dump()) if body.resources else Resources()
        except ValueError as exc:
            raise ApiError(400, "invalid_request", str(exc)) from None
        request = CreateRequest(
            image=body.image,
            driver=body.driver,
            ttl=body.ttl_seconds,
            idle=body.idle_seconds,
            resources=resources,
        )
        sandbox = await manager.create(request)
        return sandbox.describe()

    @r.get("/sandboxes")
    async def list_sandboxes() -> list[dict[str, object]]:
        return [s.describe() for s in manager.list()]

    @r.get("/sandboxes/{sandbox_id}")
    async def get_sandbox(sandbox_id: str) -> dict[str, object]:
        return manager.get(sandbox_id).describe()

    @r.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def delete_sandbox(sandbox_id: str) -> None:
        await manager.destroy(sandbox_id, reason="requested")

    @r.post("/sandboxes/{sandbox_id}/exec")
    async def exec_in_sandbox(sandbox_id: str, body: ExecIn) -> StreamingResponse:
        manager.get(sandbox_id)  # 404 before the stream starts
        stdin = _decode_stdin(body.stdin_b64)

        async def events() -> AsyncIterator[bytes]:
            async with manager.use(sandbox_id) as channel:
                session = await channel.exec(
                    body.argv,
                    env=body.env,
                    cwd=body.cwd,
                    stdin=stdin,
                    timeout=body.timeout_seconds,
                )
                async with session:
                    try:
                        async for out in session:
                            data = base64.b64encode(out.data).decode()
                            yield _line({"stream": out.stream, "data": data})
                    except ch.GuestTimeout as exc:
                        yield _line({"error": "guest_timeout", "message": str(exc)})
                        return
                    res = session.result
                    yield _line(
                        {
                            "exit_code": res.exit_code,
                            "signal": res.signal,
                            "timed_out": res.timed_out,
                            "duration": res.duration,
                        }
                    )

        return StreamingResponse(events(), media_type="application/x-ndjson")

    @r.put("/sandboxes/{sandbox_id}/files", status_code=204)
    async def put_file(
        sandbox_id: str, request: Request, path: Annotated[str, Query(max_length=4096)]
    ) -> None:
        guest_path = ch.workspace_path(path)
        size = _content_length(request, manager.settings.max_file_bytes)
        async with manager.use(sandbox_id) as channel:
            await channel.put(guest_path, request.stream(), size)

    @r.get("/sandboxes/{sandbox_id}/files")
    async def get_file(
        sandbox_id: str, path: Annotated[str, Query(max_length=4096)]
    ) -> StreamingResponse:
        guest_path = ch.workspace_path(path)
        manager.get(sandbox_id)
        use = manager.use(sandbox_id)
        channel = await use.__aenter__()
        try:
            stream = await channel.get(guest_path)
        except BaseException:
            await use.__aexit__(None, None, None)
            raise

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await use.__aexit__(None, None, None)

        return StreamingResponse(
            body(),
            media_type="application/octet-stream",
            headers={"content-length": str(stream.size)},
        )

    return r


def _line(obj: dict[str, object]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _decode_stdin(value: str | None) -> bytes | None:
    if value is None:
        return None
    if len(value) > MAX_STDIN_BYTES * 4 // 3 + 4:
        raise ApiError(413, "too_large", f"stdin is limited to {MAX_STDIN_BYTES} bytes")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "invalid_request", "stdin_b64 is not valid base64") from None


def _content_length(request: Request, limit: int) -> int:
    raw = request.headers.get("content-length")
    if raw is None or not raw.isdigit():
        raise ApiError(411, "length_required", "uploads need a Content-Length header")
    size = int(raw)
    if size > limit:
        raise ApiError(413, "too_large", f"the file is {size} bytes; the limit is {limit} bytes")
    return size
