"""Identity errors: each carries a stable `code` and HTTP `status`, and names what is wrong."""

from __future__ import annotations

from aamp.identity.model import ANONYMOUS, Actor


class IdentityError(Exception):
    code = "invalid_request"
    status = 400


class NotFound(IdentityError):
    code = "not_found"
    status = 404


class Conflict(IdentityError):
    code = "conflict"
    status = 409


class InvalidInput(IdentityError, ValueError):
    code = "invalid_request"
    status = 400


class AuthenticationFailed(IdentityError):
    """A credential that cannot be used. `claimed` is whom it names when that is known (a
    revoked or expired token, a disabled user, an expired session): an actor with no role,
    so it is never signed in, kept only so the refusal is recorded with the user and token."""

    code = "unauthenticated"
    status = 401

    def __init__(self, message: str, *, claimed: Actor = ANONYMOUS) -> None:
        super().__init__(message)
        self.claimed = claimed


class Throttled(IdentityError):
    code = "too_many_attempts"
    status = 429
