"""Routes for signing in (UI sessions), the caller, users and API tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from aamp.api.body import Body
from aamp.api.context import ControlPlane
from aamp.api.errors import ApiError
from aamp.api.guard import (
    SESSION_COOKIE,
    actor_of,
    cp_of,
    guarded_router,
    record_change,
    request_id,
    rule,
)
from aamp.identity.directory import SESSION_HOURS, USERNAME_RE, TokenInfo, UserInfo
from aamp.identity.errors import AuthenticationFailed, Throttled
from aamp.identity.model import Actor, Resource

RoleName = Literal["admin", "builder", "operator"]
Username = Annotated[str, Field(min_length=1, max_length=64)]
Password = Annotated[str, Field(min_length=1, max_length=1024)]


class LoginIn(Body):
    username: Username
    password: Password


class SessionOut(BaseModel):
    username: str
    role: str
    csrf_token: str


class AccessOut(BaseModel):
    agent_id: str
    level: str
    source: str


class MeOut(BaseModel):
    username: str
    role: str
    via: str
    agents: list[AccessOut]


class UserOut(BaseModel):
    username: str
    role: str
    disabled: bool
    created_at: str
    created_by: str


class UserIn(Body):
    username: Username
    role: RoleName
    password: Password


class UserPatch(Body):
    role: RoleName | None = None
    disabled: bool | None = None


class PasswordIn(Body):
    password: Password
    # Needed when the caller changes their own password (a stolen token alone must not
    # become the password); an admin resetting someone else's gives none.
    current_password: Password | None = None


@dataclass(frozen=True, kw_only=True)
class NewTokenOut(TokenInfo):
    token: Annotated[str, Field(description="the secret; shown only in this response")]


class TokenIn(Body):
    name: Annotated[str, Field(min_length=1, max_length=64)] = "api"
    expires_in_days: Annotated[int, Field(ge=1, le=3650)] | None = None


async def _path_user(request: Request, _: ControlPlane, __: Actor) -> Resource:
    username = request.path_params.get("username", "")
    return Resource("user", username, subject_user=username)


async def _token_owner(request: Request, cp: ControlPlane, _: Actor) -> Resource:
    token_id = str(request.path_params.get("token_id", ""))[:64]
    owner = await cp.store.run(cp.directory.token_owner, token_id)
    return Resource("token", token_id, owner=owner)


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def _checked_password(request: Request, username: str, password: str) -> UserInfo:
    """The user if `password` is theirs, checked under the login throttle: a wrong one counts
    as a failed login (for the username and the client's address), a right one clears
    them; raises `AuthenticationFailed` or `Throttled`."""
    cp = cp_of(request)
    attempt: tuple[int, ...] = ()
    try:
        attempt = await cp.store.run(cp.throttle.attempt, username, _address(request))
        user = await cp.store.run(cp.directory.check_password, username, password)
    except Exception as exc:
        if attempt and not isinstance(exc, AuthenticationFailed):
            await cp.store.run(cp.throttle.forget, attempt)  # counted only wrong passwords
        raise
    await cp.store.run(cp.throttle.succeeded, username, attempt)
    return user


async def _own_password_checked(request: Request, username: str, given: str | None) -> None:
    if given is None:
        raise ApiError(
            400,
            "current_password_needed",
            "current_password: changing your own password needs your current one",
        )
    try:
        await _checked_password(request, username, given)
    except (AuthenticationFailed, Throttled) as exc:
        wrong = isinstance(exc, AuthenticationFailed)
        await cp_of(request).audit.record(
            actor=f"user:{username}",
            action="user.password_change",
            resource=f"user:{username}",
            decision="deny",
            reason="the current password given is wrong" if wrong else str(exc),
            request_id=request_id(request),
            details={"address": _address(request)},
        )
        if wrong:  # 403, not 401: the caller's own credential is still good
            raise ApiError(
                403, "wrong_password", "current_password: not your current password"
            ) from None
        raise


def router() -> APIRouter:
    r = guarded_router(prefix="/v1")

    @r.post("/session", response_model=SessionOut, tags=["identity"])
    @rule("session.create")
    async def login(body: LoginIn, request: Request, response: Response) -> SessionOut:
        """Sign in with a password: sets the session cookie, returns the CSRF token."""
        cp = cp_of(request)
        address = _address(request)
        subject = f"user:{body.username}" if USERNAME_RE.match(body.username) else "user:?"
        try:
            user = await _checked_password(request, body.username, body.password)
        except Exception as exc:
            await cp.audit.record(
                actor="anonymous",
                action="login",
                resource=subject,
                decision="deny",
                reason=str(exc),
                request_id=request_id(request),
                details={"address": address},
            )
            raise
        secret, csrf = await cp.store.run(cp.directory.create_session, user)
        await cp.audit.record(
            actor=f"user:{user.username}",
            action="login",
            resource=subject,
            decision="allow",
            reason="password accepted",
            request_id=request_id(request),
            details={"address": address},
        )
        response.set_cookie(
            SESSION_COOKIE,
            secret,
            max_age=SESSION_HOURS * 3600,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return SessionOut(username=user.username, role=user.role.value, csrf_token=csrf)

    @r.delete("/session", status_code=204, tags=["identity"])
    @rule("session.delete")
    async def logout(request: Request, response: Response) -> None:
        """Sign out: ends the cookie session (a no-op for bearer tokens)."""
        cp = cp_of(request)
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie and actor_of(request).via == "session":
            await cp.store.run(cp.directory.delete_session, cookie)
        response.delete_cookie(SESSION_COOKIE, path="/")

    @r.get("/me", response_model=MeOut, tags=["identity"])
    @rule("me.read")
    async def me(request: Request) -> MeOut:
        actor = actor_of(request)
        return MeOut(
            username=actor.username or "",
            role=actor.role.value if actor.role else "",
            via=actor.via,
            agents=[
                AccessOut(agent_id=a, level=acc.level.value, source=acc.source)
                for a, acc in sorted(actor.agents.items())
            ],
        )

    @r.get("/users", response_model=list[UserOut], tags=["users"])
    @rule("user.list")
    async def list_users(request: Request) -> list[dict[str, object]]:
        cp = cp_of(request)
        return [u.to_dict() for u in await cp.store.run(cp.directory.list_users)]

    @r.post("/users", status_code=201, response_model=UserOut, tags=["users"])
    @rule("user.create")
    async def create_user(body: UserIn, request: Request) -> dict[str, object]:
        cp = cp_of(request)
        user = await cp.store.run(
            lambda: cp.directory.create_user(
                body.username, body.role, body.password, by=actor_of(request).audit_name
            )
        )
        await record_change(request, "user.created", f"user:{user.username}", {"role": body.role})
        return user.to_dict()

    @r.get("/users/{username}", response_model=UserOut, tags=["users"])
    @rule("user.read", _path_user)
    async def get_user(username: Username, request: Request) -> dict[str, object]:
        cp = cp_of(request)
        return (await cp.store.run(cp.directory.get_user, username)).to_dict()

    @r.patch("/users/{username}", response_model=UserOut, tags=["users"])
    @rule("user.update", _path_user)
    async def update_user(
        username: Username, body: UserPatch, request: Request
    ) -> dict[str, object]:
        """Change a user's role or disable them (admins, never on themselves)."""
        cp = cp_of(request)
        user = await cp.store.run(
            lambda: cp.directory.update_user(username, role=body.role, disabled=body.disabled)
        )
        await record_change(
            request,
            "user.updated",
            f"user:{username}",
            body.model_dump(exclude_none=True),
        )
        return user.to_dict()

    @r.put("/users/{username}/password", status_code=204, tags=["users"])
    @rule("user.password", _path_user)
    async def set_password(username: Username, body: PasswordIn, request: Request) -> None:
        """Set a user's password: your own with your current one (`current_password`), or
        anyone's as an admin. Every session of the user ends; API tokens stay (revoke them
        with `DELETE /v1/tokens/ID`)."""
        cp = cp_of(request)
        if actor_of(request).username == username:
            await _own_password_checked(request, username, body.current_password)
        await cp.store.run(cp.directory.set_password, username, body.password)
        await record_change(request, "user.password_changed", f"user:{username}", {})

    @r.get("/tokens", response_model=list[TokenInfo], tags=["tokens"])
    @rule("token.list")
    async def list_tokens(request: Request) -> list[dict[str, object]]:
        """Your own tokens (an admin sees everyone's)."""
        cp, actor = cp_of(request), actor_of(request)
        mine = None if actor.role is not None and actor.role.value == "admin" else actor.username
        return [t.to_dict() for t in await cp.store.run(cp.directory.list_tokens, mine)]

    @r.post("/tokens", status_code=201, response_model=NewTokenOut, tags=["tokens"])
    @rule("token.create")
    async def create_token(body: TokenIn, request: Request) -> dict[str, object]:
        """A new API token for yourself, with your role; the secret is shown only here."""
        cp, actor = cp_of(request), actor_of(request)
        assert actor.username is not None
        info, secret = await cp.store.run(
            lambda: cp.directory.create_token(
                actor.username or "", body.name, days=body.expires_in_days
            )
        )
        await record_change(
            request, "token.created", f"token:{info.id}", {"expires_at": info.expires_at}
        )
        return {**info.to_dict(), "token": secret}

    @r.post(
        "/users/{username}/tokens", status_code=201, response_model=NewTokenOut, tags=["tokens"]
    )
    @rule("token.create_for", _path_user)
    async def create_token_for(
        username: Username, body: TokenIn, request: Request
    ) -> dict[str, object]:
        """A new API token for another user, with that user's role (admins); the secret is
        shown only here, for the admin to hand over (`aamp token create --for USER`)."""
        cp = cp_of(request)
        info, secret = await cp.store.run(
            lambda: cp.directory.create_token(username, body.name, days=body.expires_in_days)
        )
        await record_change(
            request,
            "token.created",
            f"token:{info.id}",
            {"expires_at": info.expires_at, "for": username},
        )
        return {**info.to_dict(), "token": secret}

    @r.delete("/tokens/{token_id}", response_model=TokenInfo, tags=["tokens"])
    @rule("token.revoke", _token_owner)
    async def revoke_token(
        token_id: Annotated[str, Field(max_length=64)], request: Request
    ) -> dict[str, object]:
        cp = cp_of(request)
        info = await cp.store.run(cp.directory.revoke_token, token_id)
        await record_change(request, "token.revoked", f"token:{token_id}", {})
        return info.to_dict()

    return r
