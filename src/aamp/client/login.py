"""Signing in with a password for an API token, and signing out, through the API alone.

`login` opens a UI-style session (`POST /v1/session`: the password is checked, throttled and
audited there), uses it once to make an API token for the user (`POST /v1/tokens`, with the
session's CSRF token), and ends the session; the token is stored in a login profile
(`aamp.client.profiles`). `logout` revokes the profile's token on its control plane, then
forgets the profile. So no password is ever stored, and every step is the API's own, under
its guard and audit.
"""

from __future__ import annotations

from http.cookies import SimpleCookie

from aamp.client.profiles import DEFAULT_NAME, Profiles, check_name
from aamp.client.transport import ClientError, Connection

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

SESSION_COOKIE = "aamp_session"
CSRF_HEADER = "x-csrf-token"
LOGIN_TOKEN_DAYS = 30


def login(
    env: Mapping[str, str],
    url: str,
    username: str,
    password: str,
    *,
    profile: str | None = None,
    days: int = LOGIN_TOKEN_DAYS,
) -> tuple[str, dict[str, Any]]:
    """Sign in at `url` and store the new token as `profile` (default: "default"), which
    becomes the default profile. Returns the profile's name and what it holds."""
    name = check_name(profile or DEFAULT_NAME)
    profiles = Profiles.load(env)  # a broken or unsafe file is refused before signing in
    url = url.rstrip("/")
    conn = Connection(url, {"user-agent": "aamp-login"}, timeout=60)
    try:
        opened = conn.send("POST", "/v1/session", json={"username": username, "password": password})
        cookie = SimpleCookie()
        for header in opened.headers.get_all("set-cookie") or []:
            cookie.load(header)
        if SESSION_COOKIE not in cookie:
            raise ClientError("login_failed", f"{url} answered the sign-in without a session")
        session = {
            "cookie": f"{SESSION_COOKIE}={cookie[SESSION_COOKIE].value}",
            CSRF_HEADER: opened.json()["csrf_token"],
        }
        try:
            made = conn.send(
                "POST",
                "/v1/tokens",
                json={"name": f"aamp login {name}", "expires_in_days": days},
                headers=session,
            ).json()
        finally:
            conn.send("DELETE", "/v1/session", headers=session)
    finally:
        conn.close()
    held = {
        "url": url,
        "username": username,
        "token": made["token"],
        "token_id": made["id"],
        "expires_at": made.get("expires_at"),
    }
    profiles.profiles[name] = held
    profiles.default = name
    profiles.save()
    return name, held


def logout(env: Mapping[str, str], profile: str | None = None) -> str:
    """Revoke the profile's token (named, else the default one) and forget the profile.
    A token the control plane no longer knows (revoked, expired) still lets go of it."""
    profiles = Profiles.load(env)
    chosen = profiles.chosen(profile)
    if chosen is None:
        raise ClientError("no_profile", f"not logged in: {profiles.path} names no default profile")
    name, held = chosen
    conn = Connection(held["url"], {"authorization": f"Bearer {held['token']}"}, timeout=60)
    try:
        conn.send("DELETE", f"/v1/tokens/{held['token_id']}")
    except ClientError as exc:
        if exc.status != 401:  # a token already dead is what logging out wants
            raise
    finally:
        conn.close()
    del profiles.profiles[name]
    if profiles.default == name:
        profiles.default = None
    profiles.save()
    return name
