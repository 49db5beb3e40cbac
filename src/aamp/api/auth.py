"""Bootstrap authentication: one installation token, until identity and grants exist.

`aamp up` writes a random token to `$AAMP_HOME/cli-token` (mode 0600) and every /v1 route but
health requires it as a bearer token. Only someone who can read that file (the installation's
owner) can call the API; the identity issue replaces this with users, roles and grants.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from fastapi import Request

from aamp.api.errors import ApiError


def ensure_token(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class RequireToken:
    """A FastAPI dependency: the request must carry the installation token."""

    def __init__(self, token: str):
        self._token = token.encode()

    async def __call__(self, request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise ApiError(401, "unauthenticated", "a bearer token is required")
        if not hmac.compare_digest(value.strip().encode(), self._token):
            raise ApiError(401, "unauthenticated", "the bearer token is not valid")
