"""The FastAPI application: routes, error handling, authentication, lifespan."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI

from aamp import __version__
from aamp.api import sandboxes
from aamp.api.auth import RequireToken
from aamp.api.errors import install_error_handlers
from aamp.sandbox.channel import (
    FileTooLargeError,
    GuestError,
    GuestProtocolError,
    GuestTimeout,
    GuestUnavailable,
    PathEscapeError,
)
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import SandboxError, SandboxManager


def create_app(manager: SandboxManager, images: ImageStore, token: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await manager.start()
        try:
            yield
        finally:
            await manager.shutdown()

    app = FastAPI(title="aamp", version=__version__, lifespan=lifespan)

    @app.get("/v1/health")
    async def health() -> dict[str, object]:
        return {
            "status": "ok",
            "version": __version__,
            "drivers": sorted(manager.drivers),
            "default_driver": manager.default_driver,
            "sandboxes": len(manager.list()),
            "warm_pool": manager.pool_status(),
        }

    app.include_router(
        sandboxes.router(manager, images), dependencies=[Depends(RequireToken(token))]
    )
    install_error_handlers(
        app,
        {
            SandboxError: 400,
            PathEscapeError: 400,
            FileTooLargeError: 413,
            GuestError: 422,
            GuestProtocolError: 502,
            GuestTimeout: 504,
            GuestUnavailable: 503,
        },
    )
    return app
