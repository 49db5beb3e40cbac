"""The whole site `aamp up` serves on one port: the API under `/v1` (and `/openapi.json`),
the UI under `/`, and the security headers on every response of both.

The headers: a Content-Security-Policy that lets a page load only this installation's own
files (no inline script or style, no eval, no frames, forms only to itself; images also as
`data:` URLs, which is how a run's screenshots are shown inline), `X-Frame-Options: DENY`,
`nosniff`, and no referrer to other sites.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aamp.api import ControlPlane, create_app
from aamp.web.app import create_web

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


def is_api(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/") or path == "/openapi.json"


def create_site(cp: ControlPlane) -> ASGIApp:
    """The API app and the UI in front of it; the API's lifespan is the site's."""
    return site_of(create_app(cp))


def site_of(api: ASGIApp) -> ASGIApp:
    """The site around an API app already built (tests build theirs with `create_app`)."""
    web = create_web(api)

    async def site(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await api(scope, receive, send)
            return
        target = api if is_api(scope.get("path", "")) else web

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await target(scope, receive, send_with_headers if scope["type"] == "http" else send)

    return site
