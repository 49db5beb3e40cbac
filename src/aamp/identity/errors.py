"""Identity errors: each carries a stable `code` and HTTP `status`, and names what is wrong."""

from __future__ import annotations


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
    code = "unauthenticated"
    status = 401


class Throttled(IdentityError):
    code = "too_many_attempts"
    status = 429
