"""`/mcp` on the control plane: MCP over streamable HTTP, beside the API, with a bearer token.

`with_mcp(api_app, api_url)` is the ASGI app `aamp up` serves: `/mcp` goes to the MCP
server, everything else to the API app, which stays exactly what `create_app` built (every
route behind the guard). The MCP side holds no authority of its own: a request without a
bearer token is answered 401 before MCP sees it, and each tool call acts with the request's
token through the API at `api_url` (this very process), where the guard authenticates,
decides and audits it like any other API request. Stateless (no MCP session kept between
requests), so replicas behind a load balancer need nothing shared.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import Context

from aamp.mcp.tools import build_server

MCP_PATH = "/mcp"


def _bearer(headers: Any) -> str | None:
    value = (headers or {}).get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def with_mcp(api_app: Any, api_url: str, *, host: str = "127.0.0.1") -> Any:
    def credentials(ctx: Context) -> tuple[str, str]:
        token = _bearer(ctx.headers)
        assert token is not None  # refused below before MCP runs
        return api_url, token

    server = build_server(credentials)
    mcp_app = server.streamable_http_app(
        streamable_http_path=MCP_PATH, stateless_http=True, json_response=True, host=host
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            async with server.session_manager.run():
                await api_app(scope, receive, send)
            return
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == MCP_PATH or path.startswith(MCP_PATH + "/")):
            await api_app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if _bearer(headers) is None:
            body = json.dumps(
                {
                    "code": "unauthenticated",
                    "message": "/mcp needs an API token: Authorization: Bearer TOKEN",
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"www-authenticate", b"Bearer"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await mcp_app(scope, receive, send)

    return app
