"""The HTTP API under /v1 (FastAPI): the only way the CLI and the UI reach the host process.

`create_app(cp)` builds the app from a `ControlPlane` (everything the routes use, built once
by `aamp.server`). Names load on first use (`aamp.surface`).
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    app: create_app
    context: DEFAULT_MAX_BODY_BYTES MAX_EXEC_BODY_BYTES ControlPlane SandboxOwner
    errors: ApiError error_response
    guard: CSRF_HEADER SESSION_COOKIE bearer_actor record_connect_refusal
    middleware: BodyLimitMiddleware RequestIdMiddleware
    run_resolve: rebuilt_request
    """,
)
