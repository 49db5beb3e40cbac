"""The FastAPI application: routes, the one guard, error handling, limits, lifespan.

`create_app(cp)` makes every route a `GuardedRoute`, whose handler runs the one `guard`
(authenticate, `allowed`, audit) first, so a route cannot opt out; see `guard.py`. It
refuses to build an app with any route outside the guard or without a rule — the OpenAPI
document included, which is served as a guarded route for signed-in users. The lifespan
starts the audit log before the sandbox manager (whose reaper records through it) and stops
them in reverse.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from fastapi.telemetry import TelemetryConfig

from aamp import __version__
from aamp.api import (
    agents,
    audit,
    catalog,
    hosts,
    image_builds,
    knowledge_bases,
    runs,
    sandboxes,
    screenshots,
    secrets,
    users,
    wheelhouse,
)
from aamp.api.context import MAX_EXEC_BODY_BYTES, ControlPlane
from aamp.api.errors import ERROR_RESPONSES, document_errors, install_error_handlers
from aamp.api.guard import (
    RULE_ATTR,
    GuardedRoute,
    cp_of,
    guarded_router,
    late_route_guard,
    rule,
)
from aamp.api.middleware import BodyLimitMiddleware, RequestIdMiddleware
from aamp.audit import AuditInputError
from aamp.errors import AampError
from aamp.policy import PolicyError
from aamp.sandbox import (
    FileTooLargeError,
    GuestError,
    GuestProtocolError,
    GuestTimeout,
    GuestUnavailable,
    PathEscapeError,
)
from aamp.vault import SecretNameError, SecretNotFound, SecretValueError

NO_TELEMETRY: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
}


def _limit_for(cp: ControlPlane):  # type: ignore[no-untyped-def]
    def limit(path: str) -> int | None:
        if path.startswith("/v1/sandboxes/") and path.endswith("/files"):
            return None  # the route checks AAMP_MAX_FILE_BYTES itself
        if path.startswith("/v1/knowledge-bases/") and "/documents/" in path:
            return None  # the route checks MAX_DOCUMENT_BYTES itself
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
                await catalog.keep_policies_warm(cp)  # after the manager started
                await cp.fleet.start()  # registers this process's own host, if it runs one
                if cp.runs is not None:
                    await cp.runs.recover()  # after the manager reaped their sandboxes
                try:
                    yield
                finally:
                    if cp.runs is not None:
                        await cp.runs.shutdown()
            finally:
                await cp.fleet.stop()
                await cp.manager.shutdown()
                await cp.links.close()  # last: the runs and the manager are done with them
        finally:
            await cp.audit.close()

    app = FastAPI(
        title="aamp",
        version=__version__,
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        # FastAPI's own schema and docs routes would sit outside the guard (no token, no
        # audit record); the schema is served below as a guarded route instead. The Swagger
        # and ReDoc pages load their scripts from a CDN, which an air-gapped installation
        # never reaches, so they are not served at all.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # FastAPI's own OpenTelemetry hooks: aamp configures no OpenTelemetry provider, so
        # they only cost every request their checks (providers looked up, operation spans
        # opened around dependencies, the endpoint and serialisation).
        telemetry=NO_TELEMETRY,
        # Only for a route added after this function checked them all (an included router,
        # `app.get`): every route made here is a `GuardedRoute`, which does not carry it.
        dependencies=[Depends(late_route_guard)],
    )
    app.state.cp = cp
    own = guarded_router()

    @own.get("/openapi.json", include_in_schema=False)
    @rule("api.schema")
    async def openapi_document(request: Request) -> JSONResponse:
        """The OpenAPI document (the API's reference), for signed-in users."""
        return JSONResponse(request.app.openapi())

    @own.get("/v1/health", tags=["health"])
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

    app.router.routes.extend(own.routes)
    for module in (
        users,
        agents,
        catalog,
        secrets,
        audit,
        sandboxes,
        image_builds,
        screenshots,
        runs,
        wheelhouse,
        hosts,
        knowledge_bases,
    ):
        # The routes themselves, not an included router: FastAPI matches an included router's
        # routes again at each level (three passes a request), the app's own routes once.
        app.router.routes.extend(module.router().routes)
    install_error_handlers(
        app,
        {
            AampError: 400,
            PolicyError: 400,
            SecretNameError: 400,
            SecretValueError: 400,
            SecretNotFound: 404,
            AuditInputError: 400,
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
    _check_every_route_is_guarded(app)
    document_errors(app)
    return app


def _check_every_route_is_guarded(app: FastAPI) -> None:
    """Refuse to build an app with a route the guard would not see (a plain Starlette route,
    a mount) or that has no rule: such a route would answer without a decision on record.
    (Routes of included routers are walked too: FastAPI keeps them inside the router.)"""
    for route in iter_route_contexts(app.routes):
        guarded = isinstance(route.original_route, GuardedRoute)
        if not guarded or getattr(route.endpoint, RULE_ATTR, None) is None:
            where = route.path or repr(route.original_route)
            raise RuntimeError(f"route {where} is not behind the guard with a rule (@rule)")
