"""The errors of signing in: a credential that cannot be used, too many failed attempts."""

from __future__ import annotations

from aamp.errors import AampError
from aamp.identity.model import ANONYMOUS, Actor


class AuthenticationFailed(AampError, code="unauthenticated", status=401):
    """A credential that cannot be used. `claimed` is whom it names when that is known (a
    revoked or expired token, a disabled user, an expired session): an actor with no role,
    so it is never signed in, kept only so the refusal is recorded with the user and token."""

    def __init__(self, message: str, *, claimed: Actor = ANONYMOUS) -> None:
        super().__init__(message)
        self.claimed = claimed


class Throttled(AampError, code="too_many_attempts", status=429):
    """Too many failed sign-ins for this user or client address; try again later."""
