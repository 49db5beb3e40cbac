"""`/mcp` on the control plane: MCP over streamable HTTP, beside the API, with a bearer token.

`with_mcp(app, cp, api_url)` is the ASGI app `aamp up` serves: `/mcp` goes to the MCP
server, everything else to `app` (the site: the API and the UI), unchanged. A request to
`/mcp` under a `Host` (or from an `Origin`) that is not the installation's own
(`hosts`: AAMP_MCP_ALLOWED_HOSTS) is answered 421 (403) and recorded as `mcp.connect`
denied, with its actor. Every request to
`/mcp` is authenticated first by the API guard's own token check (`bearer_actor`): without a
usable bearer token — none, garbage, unknown, revoked, expired, or its user disabled — it is
answered 401 before MCP reads it, and the refusal is in the audit log (`mcp.connect`, with
whom the token names when known), as the API records a refused credential. A session cookie
does not count: `/mcp` is for programs, and a page of another site cannot set a bearer header.

The MCP side holds no authority of its own: each tool call acts with the request's token
through the API of this very process, called in process (`in_process`: the site app itself,
no loopback socket), where the guard authenticates, decides and audits it like any other API
request; the SDK client doing so is kept per token (`clients`), and closed as soon as its
token is refused here. (`api_url` is only the address those requests name as their host.)
Stateless (no MCP session kept between requests), so replicas behind a load balancer need
nothing shared.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request

from aamp.api import ApiError, ControlPlane, RequestIdMiddleware, bearer_actor, error_response
from aamp.api.guard import record_connect_refusal
from aamp.client import AsyncClient
from aamp.mcp.clients import TokenClients
from aamp.mcp.hosts import allowed_hosts, refusal
from aamp.mcp.tools import build_server

MCP_PATH = "/mcp"
CONNECT_ACTION = "mcp.connect"  # the action a refused credential at /mcp is recorded under


def _bearer(headers: Any) -> str:
    """The request's bearer token (`bearer_actor` has accepted it before any tool runs)."""
    return str((headers or {}).get("authorization", "")).partition(" ")[2].strip()


def with_mcp(app: Any, cp: ControlPlane, api_url: str) -> Any:
    hosts = allowed_hosts(cp.settings)  # a bad AAMP_MCP_ALLOWED_HOSTS stops `aamp up` here
    clients = TokenClients(api_url, app=app)

    async def client_for(ctx: Context) -> AsyncClient:
        return await clients.get(_bearer(ctx.headers))

    server = build_server(client_for)
    server.streamable_http_app(  # makes the session manager; its Starlette app is not used
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        # Host and Origin are checked here, before MCP (`hosts`), and refusals recorded.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    # Straight to the session manager, not through the SDK's Starlette app around it (error
    # and exception middleware, a router of one route): that only added its cost to every
    # call. Its one rule, that only /mcp is served (its redirect of /mcp/ aside: that is
    # served too), is `authenticated_mcp`'s.
    manager = server.session_manager

    async def authenticated_mcp(scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = Request(scope)
        try:
            actor = await bearer_actor(request, cp, CONNECT_ACTION)
        except ApiError as exc:
            await clients.drop(_bearer(request.headers))
            answer = error_response(exc.status, exc.code, exc.message)
            answer.headers["www-authenticate"] = "Bearer"
            await answer(scope, receive, send)
            return
        refused = refusal(request.headers.get("host"), request.headers.get("origin"), hosts)
        if refused is not None:
            await record_connect_refusal(request, cp, actor, CONNECT_ACTION, refused.message)
            await error_response(*refused)(scope, receive, send)
            return
        if scope.get("path") not in (MCP_PATH, MCP_PATH + "/"):
            await error_response(404, "not_found", f"MCP is served at {MCP_PATH} only")(
                scope, receive, send
            )
            return
        await manager.handle_request(scope, receive, send)

    guarded_mcp = RequestIdMiddleware(authenticated_mcp)

    async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            async with server.session_manager.run():
                try:
                    await app(scope, receive, send)
                finally:
                    await clients.close()
            return
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == MCP_PATH or path.startswith(MCP_PATH + "/")):
            await guarded_mcp(scope, receive, send)
            return
        await app(scope, receive, send)

    return serve
