"""The one guard every route goes through: authenticate, find the resource, ask `allowed`,
record the decision in the audit log, and refuse or proceed.

It is installed as an app-wide FastAPI dependency, so no route can leave it out. A route
declares what it does with `@rule(action, resolver)`; a route without a rule is denied (and
the authorisation matrix test fails for it). The decision — allow or deny, its reason, and
the grant that allowed it — is durable in the audit log before the route runs.

Credentials: `Authorization: Bearer <API token>`, or the UI's session cookie; with a cookie,
unsafe methods must also carry the session's CSRF token in `X-CSRF-Token`.

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
(`identity.lookup`), run without a thread hop (`Store.run` and `read_plan`: inline on
SQLite, on the event loop's own asyncio connections on PostgreSQL); nothing about tokens,
users or grants is cached, so a revoked token, a disabled user or a removed grant counts from
the next request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request

from aamp.api.context import ControlPlane
from aamp.api.errors import ApiError
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


def rule(action: str, resolver: Resolver | None = None) -> Callable[[F], F]:
    """Declare a route's action and how to find the resource it acts on."""

    def mark(endpoint: F) -> F:
        setattr(endpoint, RULE_ATTR, RouteRule(action, resolver or kind(action.split(".")[0])))
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


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, for resolvers; {} if there is none or it is not an object.

    (The body is cached by Starlette, so the route's own parsing still sees it.)
    """
    try:
        data = json.loads(await request.body() or b"{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


async def _authenticate(request: Request, cp: ControlPlane) -> Actor:
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthenticationFailed("the Authorization header must be 'Bearer <token>'")
        secret = value.strip()
        if len(secret) > 256:
            raise AuthenticationFailed("the bearer token is not valid")
        actor, stale = await cp.store.run(cp.directory.token_actor, secret)
        if stale:
            await cp.store.run(cp.directory.touch_token, actor.token_id or "")
        return actor
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        if len(cookie) > 256:
            raise AuthenticationFailed("the session is not valid; sign in again")
        actor, csrf_hash = await cp.store.run(cp.directory.actor_for_session, cookie)
        if request.method in UNSAFE_METHODS:
            given = request.headers.get(CSRF_HEADER, "")
            if not given or not cred.same(cred.digest(given), csrf_hash):
                raise ApiError(403, "csrf_failed", f"the {CSRF_HEADER} header is missing or wrong")
        return actor
    return ANONYMOUS


async def _record(
    cp: ControlPlane,
    request: Request,
    actor: Actor | str,
    action: str,
    resource: str,
    decision: Decision,
) -> None:
    details: dict[str, Any] = {"method": request.method, "path": request.url.path}
    if isinstance(actor, Actor):
        details["via"] = actor.via
        if actor.token_id:
            details["token"] = actor.token_id
    if decision.grant_id is not None:
        details["grant_id"] = decision.grant_id
    await cp.audit.record(
        actor=actor.audit_name if isinstance(actor, Actor) else actor,
        action=action,
        resource=resource[:512],
        decision=decision.word,
        reason=decision.reason,
        request_id=request_id(request),
        details=details,
    )


async def guard(request: Request) -> Actor:
    """The app-wide dependency (see the module docstring)."""
    cp = cp_of(request)
    endpoint = request.scope.get("endpoint")
    route_rule: RouteRule | None = getattr(endpoint, RULE_ATTR, None)
    action = route_rule.action if route_rule else "route.unruled"
    try:
        actor = await _authenticate(request, cp)
    except AuthenticationFailed as exc:
        await _record(cp, request, "anonymous", action, action, Decision(False, exc.args[0]))
        raise ApiError(401, "unauthenticated", exc.args[0]) from None
    except ApiError as exc:
        await _record(cp, request, "anonymous", action, action, Decision(False, exc.message))
        raise
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


async def record_change(
    request: Request, action: str, resource: str, details: dict[str, Any]
) -> None:
    """Record a change a route made (after the guard recorded that it was allowed)."""
    cp = cp_of(request)
    await cp.audit.record(
        actor=actor_of(request).audit_name,
        action=action,
        resource=resource[:512],
        decision="allow",
        reason=request.state.decision.reason,
        request_id=request_id(request),
        details=details,
    )
