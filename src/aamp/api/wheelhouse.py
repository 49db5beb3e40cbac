"""The offline wheelhouse's routes (`aamp wheelhouse add|ls|rm`): list its wheels (staff), add
by requirement (pip downloads on the host) or by uploading a wheel file, remove (admins).
Each change is audited with the wheels' names, versions and SHA-256."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from pydantic import Field

from aamp.api.body import Body
from aamp.api.errors import ApiError
from aamp.api.guard import cp_of, guarded_router, record_change, rule
from aamp.sandbox.wheelhouse import (
    MAX_WHEEL_BYTES,
    WHEEL_FILENAME,
    Wheel,
    Wheelhouse,
    WheelhouseError,
)

WHEEL_NAME = f"^{WHEEL_FILENAME}$"  # pydantic's (Rust) `$` is the end of the text only
Requirement = Annotated[str, Field(min_length=1, max_length=500)]


class AddIn(Body):
    requirements: list[Requirement] = Field(min_length=1, max_length=100)


def _wheelhouse(request: Request) -> Wheelhouse:
    return Wheelhouse(cp_of(request).manager.settings)


def _shown(wheels: list[Wheel]) -> list[dict[str, object]]:
    return [w.to_dict() for w in wheels]


async def _record(request: Request, action: str, wheels: list[Wheel]) -> None:
    for wheel in wheels:
        await record_change(
            request,
            action,
            f"wheel:{wheel.name}=={wheel.version}",
            {"filename": wheel.filename, "sha256": wheel.sha256, "size": wheel.size},
        )


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["wheelhouse"])

    @r.get("/wheelhouse")
    @rule("wheelhouse.list")
    async def list_wheels(request: Request) -> list[dict[str, object]]:
        return _shown(await asyncio.to_thread(_wheelhouse(request).list))

    @r.post("/wheelhouse", status_code=201)
    @rule("wheelhouse.add")
    async def add_requirements(body: AddIn, request: Request) -> list[dict[str, object]]:
        """Download requirements and their dependencies as wheels for the guest's Python."""
        by = request.state.actor.audit_name
        try:
            added = await asyncio.to_thread(_wheelhouse(request).add, body.requirements, by=by)
        except WheelhouseError as exc:
            raise ApiError(400, "invalid_wheel", str(exc)) from None
        await _record(request, "wheelhouse.added", added)
        return _shown(added)

    @r.put("/wheelhouse/wheels/{filename}", status_code=201)
    @rule("wheelhouse.add")
    async def upload_wheel(
        filename: Annotated[str, Path(pattern=WHEEL_NAME)], request: Request
    ) -> list[dict[str, object]]:
        """Add one wheel file (brought on media to an air-gapped site)."""
        by = request.state.actor.audit_name
        with tempfile.TemporaryDirectory(prefix="aamp-upload-") as tmp:
            path = FilePath(tmp) / filename
            seen = 0
            with open(path, "wb") as f:
                async for chunk in request.stream():
                    seen += len(chunk)
                    if seen > MAX_WHEEL_BYTES:
                        raise ApiError(413, "too_large", f"a wheel is at most {MAX_WHEEL_BYTES} B")
                    f.write(chunk)
            try:
                added = await asyncio.to_thread(_wheelhouse(request).add_files, [path], by=by)
            except WheelhouseError as exc:
                raise ApiError(400, "invalid_wheel", str(exc)) from None
        await _record(request, "wheelhouse.added", added)
        return _shown(added)

    @r.delete("/wheelhouse/{name}")
    @rule("wheelhouse.remove")
    async def remove_wheels(
        name: Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")],
        request: Request,
        version: Annotated[str | None, Query(max_length=100)] = None,
    ) -> list[dict[str, object]]:
        """Remove a package's wheels (one version's, with ?version=)."""
        try:
            gone = await asyncio.to_thread(_wheelhouse(request).remove, name, version)
        except WheelhouseError as exc:
            raise ApiError(404, "not_found", str(exc)) from None
        await _record(request, "wheelhouse.removed", gone)
        return _shown(gone)

    return r
