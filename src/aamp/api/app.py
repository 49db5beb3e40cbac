"""The FastAPI application: routes, the one guard, error handling, limits, lifespan.

`create_app(cp)` wires every router behind the app-wide `guard` dependency (authenticate,
`allowed`, audit), so a route cannot opt out; see `guard.py`. The lifespan starts the audit
log before the sandbox manager (whose reaper records through it) and stops them in reverse.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, Request

from aamp import __version__
from aamp.api import agents, audit, catalog, runs, sandboxes, secrets, users
from aamp.api.context import MAX_EXEC_BODY_BYTES, ControlPlane
from aamp.api.errors import ERROR_RESPONSES, install_error_handlers
from aamp.api.guard import cp_of, guard, rule
from aamp.api.middleware import BodyLimitMiddleware, RequestIdMiddleware
from aamp.audit import AuditInputError
from aamp.identity import IdentityError
from aamp.policy import PolicyError
from aamp.sandbox.channel import (
    FileTooLargeError,
    GuestError,
    GuestProtocolError,
    GuestTimeout,
    GuestUnavailable,
    PathEscapeError,
)
from aamp.sandbox.manager import SandboxError
from aamp.vault import SecretNameError, SecretNotFound, SecretValueError


def _limit_for(cp: ControlPlane):  # type: ignore[no-untyped-def]
    def limit(path: str) -> int | None:
        if path.startswith("/v1/sandboxes/") and path.endswith("/files"):
            return None  # the route checks AAMP_MAX_FILE_BYTES itself
        if path.startswith("/v1/sandboxes/") and path.endswith("/exec"):
            return MAX_EXEC_BODY_BYTES
        if path.startswith("/v1/agents/") and path.endswith("/runs"):
            return MAX_EXEC_BODY_BYTES  # input files, base64 in JSON
        return cp.max_body_bytes

    return limit


def create_app(cp: ControlPlane) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await cp.audit.start()
        try:
            await cp.manager.start()
            try:
                if cp.runs is not None:
                    await cp.runs.recover()  # after the manager reaped their sandboxes
                try:
                    yield
                finally:
                    if cp.runs is not None:
                        await cp.runs.shutdown()
            finally:
                await cp.manager.shutdown()
        finally:
            await cp.audit.close()

    app = FastAPI(
        title="aamp",
        version=__version__,
        lifespan=lifespan,
        dependencies=[Depends(guard)],
        responses=ERROR_RESPONSES,
    )
    app.state.cp = cp

    @app.get("/v1/health", tags=["health"])
    @rule("health.read")
    async def health(request: Request) -> dict[str, object]:
        manager = cp_of(request).manager
        return {
            "status": "ok",
            "version": __version__,
            "drivers": sorted(manager.drivers),
            "default_driver": manager.default_driver,
            "sandboxes": len(manager.list()),
            "warm_pool": manager.pool_status(),
        }

    for module in (users, agents, catalog, secrets, audit, sandboxes, runs):
        app.include_router(module.router())
    install_error_handlers(
        app,
        {
            IdentityError: 400,
            PolicyError: 400,
            SecretNameError: 400,
            SecretValueError: 400,
            SecretNotFound: 404,
            AuditInputError: 400,
            SandboxError: 400,
            PathEscapeError: 400,
            FileTooLargeError: 413,
            GuestError: 422,
            GuestProtocolError: 502,
            GuestTimeout: 504,
            GuestUnavailable: 503,
        },
    )
    app.add_middleware(BodyLimitMiddleware, limit_for=_limit_for(cp))
    app.add_middleware(RequestIdMiddleware)
    return app
