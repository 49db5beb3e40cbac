"""The one guard every route goes through: authenticate, find the resource, ask `allowed`,
record the decision in the audit log, and refuse or proceed.

It runs first in every route: each route is a `GuardedRoute`, whose handler calls `guard` before
FastAPI reads the body or solves the route's parameters, so a refused request has nothing of it
parsed but what its resolver reads. Each API module's router is a `guarded_router` (its routes
are `GuardedRoute`s), whose routes `create_app` adds to the app itself (not as included routers,
which FastAPI matches again level by level on every request), and the app's own routes are
`GuardedRoute`s too; no route can leave it out (`create_app` refuses to build an app with a
route of any other class). The guard is not a FastAPI dependency: solved as one, it cost every
request a pass of FastAPI's dependency machinery (cache keys, parameters looked for in the path,
query, headers and cookies) for a function of the request alone. A route declares what it does
with `@rule(action, resolver)`; a route without a rule is denied (and the authorisation matrix
test fails for it). The resolver finds the resource with every fact a refusal depends on (what
is granted to the agent, whether a version is published, whether only an admin may ask this),
and may leave what it found on `request.state` for the route to use unchanged; so the decision
recorded here is the final one — a route may still reject bad input or a missing thing
(400/404/422), but never refuses on its own after an "allow". The decision — allow or deny, its
reason, and the grant that allowed it — is durable in the audit log before the route runs. A
refused credential is recorded with whom it names when that is known (the user and token of a
revoked or expired token, a disabled user, a session whose CSRF token is missing), never as
`anonymous`.

Credentials: `Authorization: Bearer <API token>`, or the UI's session cookie; with a cookie,
unsafe methods must also carry the session's CSRF token in `X-CSRF-Token`. An unsafe request
a browser sends from another origin (its `Origin` is not this installation's, or
`Sec-Fetch-Site` says cross-site) is refused whatever its credentials, signing in included.

Durability and group commit. Every request — read or action — waits until its decision
record is committed before its route runs, so nothing is answered, and nothing is done, that
the audit log could lose. The record is group-committed: the audit writer puts every record
queued while the previous commit was running (other requests' decisions, exec and egress
records) into one transaction with one fsync. That is allowed for reads and for actions
alike, because a record is only acknowledged — and the request only goes on — after that
commit returned; a failed commit fails every request in it. It is what makes an audited read
cost a share of one fsync rather than a whole one. (A read's route could even run while its
record commits, holding back only the response; that is not done, to keep one rule for every
route and because it would save latency only, not CPU.)

Hot path: a bearer token, its user and the user's grants are one SQL statement on the driver
(`identity.lookup`), with the agent a `reads_agent` route answers in the same statement, run
without a thread hop (`Store.run` and `read_plan`: inline on SQLite, on the event loop's own
asyncio connections on PostgreSQL); nothing about tokens, users or grants is cached, so a
revoked token, a disabled user or a removed grant counts from the next request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute

from aamp.api.context import ControlPlane
from aamp.api.errors import ERROR_RESPONSES, ApiError
from aamp.audit import recordable
from aamp.identity import credentials as cred
from aamp.identity.authz import PUBLIC_ACTIONS, allowed
from aamp.identity.errors import AuthenticationFailed
from aamp.identity.model import ANONYMOUS, Actor, Decision, Resource

SESSION_COOKIE = "aamp_session"
CSRF_HEADER = "x-csrf-token"
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
RULE_ATTR = "__aamp_rule__"

Resolver = Callable[[Request, ControlPlane, Actor], Awaitable[Resource]]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RouteRule:
    action: str
    resolver: Resolver
    reads_agent: bool = False


def rule(
    action: str, resolver: Resolver | None = None, *, reads_agent: bool = False
) -> Callable[[F], F]:
    """Declare a route's action and how to find the resource it acts on. `reads_agent`: the
    route answers the agent its `agent_id` path parameter names, which the guard then reads
    in the bearer token's own statement (`Directory.token_actor_and_agent`) and leaves on
    `request.state.agent_row` (its row, or None if there is no such agent) for the resolver;
    with any other credential the resolver reads it itself."""

    def mark(endpoint: F) -> F:
        found = resolver or kind(action.split(".")[0])
        setattr(endpoint, RULE_ATTR, RouteRule(action, found, reads_agent))
        return endpoint

    return mark


def kind(name: str) -> Resolver:
    """The default resolver: a resource of `name`'s kind, named by the first path parameter."""

    async def resolve(request: Request, __: ControlPlane, ___: Actor) -> Resource:
        params = list(request.path_params.values())
        return Resource(name, str(params[0])[:256] if params else "")

    return resolve


def cp_of(request: Request) -> ControlPlane:
    return request.app.state.cp  # type: ignore[no-any-return]


def actor_of(request: Request) -> Actor:
    return request.state.actor  # type: ignore[no-any-return]


def request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id") or "req-unknown"


def url_path(request: Request) -> str:
    """`request.url.path` without building the whole URL (host header parsed, query split):
    the scope's path with `?`, `#` and `\\` escaped as Starlette's `URL` escapes them, and
    tabs and line breaks dropped as `urlsplit` drops them."""
    path: str = request.scope["path"]
    if not path.isprintable():
        path = path.replace("\t", "").replace("\r", "").replace("\n", "")
    return path.replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, for resolvers; {} if there is none or it is not an object.

    (The body is cached by Starlette, so the route's own parsing still sees it.)
    """
    try:
        data = json.loads(await request.body() or b"{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


async def _authenticate(
    request: Request, cp: ControlPlane, route_rule: RouteRule | None = None
) -> tuple[Actor, str | None]:
    """The request's actor, and its session's CSRF token hash (None without a session)."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthenticationFailed("the Authorization header must be 'Bearer <token>'")
        secret = value.strip()
        if len(secret) > 256:
            raise AuthenticationFailed("the bearer token is not valid")
        if route_rule is not None and route_rule.reads_agent:
            agent_id = str(request.path_params.get("agent_id", ""))
            actor, stale, row = await cp.store.run(
                cp.directory.token_actor_and_agent, secret, agent_id
            )
            request.state.agent_row = row
        else:
            actor, stale = await cp.store.run(cp.directory.token_actor, secret)
        if stale:
            await cp.store.run(cp.directory.touch_token, actor.token_id or "")
        return actor, None
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        if len(cookie) > 256:
            raise AuthenticationFailed("the session is not valid; sign in again")
        return await cp.store.run(cp.directory.actor_for_session, cookie)
    return ANONYMOUS, None


async def bearer_actor(request: Request, cp: ControlPlane, action: str) -> Actor:
    """The actor of a request that must carry a bearer token (no session cookie counts):
    `/mcp` asks this before MCP reads a byte. The token is checked by the very code the guard
    runs (`_authenticate`), and a refusal — no header, a malformed one, an unknown, revoked
    or expired token, a disabled user — is recorded as `action` denied, with whom the token
    names when that is known, and raised as the API's 401."""
    try:
        if request.headers.get("authorization") is None:
            raise AuthenticationFailed(f"{request.url.path} needs an API token: Bearer TOKEN")
        actor, _ = await _authenticate(request, cp)
    except AuthenticationFailed as exc:
        await _record(cp, request, exc.claimed, action, action, Decision(False, exc.args[0]))
        raise ApiError(401, "unauthenticated", exc.args[0]) from None
    return actor


async def record_connect_refusal(
    request: Request, cp: ControlPlane, actor: Actor, action: str, reason: str
) -> None:
    """Record `action` refused for an authenticated `actor` by a check outside the routes
    (`/mcp`'s Host and Origin), in the shape of `bearer_actor`'s refusals."""
    await _record(cp, request, actor, action, action, Decision(False, reason))


def _csrf_failure(request: Request, csrf_hash: str | None) -> str | None:
    """Why a session's unsafe request lacks its CSRF token, or None if it is fine."""
    if csrf_hash is None or request.method not in UNSAFE_METHODS:
        return None
    given = request.headers.get(CSRF_HEADER, "")
    if given and cred.same(cred.digest(given), csrf_hash):
        return None
    return f"the {CSRF_HEADER} header is missing or wrong"


def _origin_failure(request: Request) -> str | None:
    """Why an unsafe request comes from another site's page, or None. Browsers send `Origin`
    (and `Sec-Fetch-Site`) with every POST; other clients send neither."""
    if request.method not in UNSAFE_METHODS:
        return None
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    origin = request.headers.get("origin")
    if origin is not None and origin != own:
        return f"cross-origin request refused: Origin {origin[:200]!r} is not {own!r}"
    if request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
        return "cross-origin request refused: Sec-Fetch-Site says another site sent it"
    return None


async def _record(
    cp: ControlPlane,
    request: Request,
    actor: Actor,
    action: str,
    resource: str,
    decision: Decision,
) -> None:
    details: dict[str, Any] = {"method": request.method, "path": url_path(request)}
    details["via"] = actor.via
    if actor.token_id:
        details["token"] = actor.token_id
    if decision.grant_id is not None:
        details["grant_id"] = decision.grant_id
    await cp.audit.record(
        actor=actor.audit_name,
        action=action,
        resource=recordable("resource", resource),
        decision=decision.word,
        reason=decision.reason,
        request_id=request_id(request),
        details=details,
    )


class GuardedRoute(APIRoute):
    """An API route whose handler runs `guard` before anything of the route's own: before
    FastAPI reads the body, solves the parameters or calls the endpoint (see the module
    docstring). The rule is the endpoint's `@rule`, read when the route is made."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()
        route_rule: RouteRule | None = getattr(self.endpoint, RULE_ATTR, None)

        async def guarded(request: Request) -> Response:
            await guard(request, route_rule)
            return await handler(request)

        return guarded


async def late_route_guard(request: Request) -> None:
    """The app's dependency, for a route added to it after `create_app` checked every route
    (an included router, `app.get`): such a route passes the same `guard`, with its
    endpoint's rule (denied without one). A `GuardedRoute` among them was decided by its own
    handler already, which this sees by the decision it left."""
    if getattr(request.state, "decision", None) is not None:
        return
    await guard(request, getattr(request.scope.get("endpoint"), RULE_ATTR, None))


def guarded_router(**options: Any) -> APIRouter:
    """An API module's router: every route of it is a `GuardedRoute` and documents the error
    statuses (what the app gives its own routes: `create_app`)."""
    return APIRouter(route_class=GuardedRoute, responses=ERROR_RESPONSES, **options)


async def guard(request: Request, route_rule: RouteRule | None) -> Actor:
    """Every route's first step (see the module docstring). A refused credential is recorded
    with whom it names when that is known (a revoked or expired token, a disabled user)."""
    cp = cp_of(request)
    action = route_rule.action if route_rule else "route.unruled"
    try:
        actor, csrf_hash = await _authenticate(request, cp, route_rule)
    except AuthenticationFailed as exc:
        await _record(cp, request, exc.claimed, action, action, Decision(False, exc.args[0]))
        raise ApiError(401, "unauthenticated", exc.args[0]) from None
    origin_failure = _origin_failure(request)
    if origin_failure is not None:
        await _record(cp, request, actor, action, action, Decision(False, origin_failure))
        raise ApiError(403, "cross_origin", origin_failure)
    csrf_failure = _csrf_failure(request, csrf_hash)
    if csrf_failure is not None:
        await _record(cp, request, actor, action, action, Decision(False, csrf_failure))
        raise ApiError(403, "csrf_failed", csrf_failure)
    if route_rule is None:
        route = request.scope.get("route")
        where = f"{request.method} {getattr(route, 'path', request.url.path)}"
        decision = Decision(False, f"no authorisation rule for route {where}")
        await _record(cp, request, actor, action, where, decision)
        raise ApiError(403, "forbidden", decision.reason)
    if actor.authenticated or action in PUBLIC_ACTIONS:
        resource = await route_rule.resolver(request, cp, actor)
    else:
        resource = Resource(action.split(".")[0])
    decision = allowed(actor, action, resource)
    await _record(cp, request, actor, action, str(resource), decision)
    if not decision.allowed:
        if not actor.authenticated:
            raise ApiError(401, "unauthenticated", "sign in or send a bearer token")
        raise ApiError(403, "forbidden", decision.reason)
    request.state.actor = actor
    request.state.decision = decision
    return actor


async def check(request: Request, action: str, resource: Resource) -> bool:
    """A second question to `allowed` inside a route (filtering a list item by item)."""
    return allowed(actor_of(request), action, resource).allowed


async def _record_route_outcome(
    request: Request,
    action: str,
    resource: str,
    decision: str,
    reason: str | None,
    details: dict[str, Any],
) -> None:
    cp = cp_of(request)
    await cp.audit.record(
        actor=actor_of(request).audit_name,
        action=action,
        resource=recordable("resource", resource),
        decision=decision,
        reason=reason,
        request_id=request_id(request),
        details=details,
    )


async def record_refusal(request: Request, action: str, resource: str, reason: str) -> None:
    """Record that a route refused an allowed request for what it would do (something in
    use, say): the denial, its reason and the actor, nothing changed."""
    await _record_route_outcome(request, action, resource, "deny", reason, {})


async def record_change(
    request: Request, action: str, resource: str, details: dict[str, Any]
) -> None:
    """Record a change a route made (after the guard recorded that it was allowed)."""
    await _record_route_outcome(
        request, action, resource, "allow", request.state.decision.reason, details
    )
