"""Passwords (argon2id) and bearer secrets (random, stored as SHA-256).

Passwords are low-entropy, so they get a slow memory-hard hash (argon2id with the library's
RFC 9106 "low memory" profile). API tokens and session ids are 256-bit random values: SHA-256 of
such a value cannot be reversed or guessed, and a fast hash keeps every request fast.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from argon2.profiles import RFC_9106_LOW_MEMORY

TOKEN_PREFIX = "aamp_"
MIN_PASSWORD_CHARS = 12
MAX_PASSWORD_CHARS = 1024


class PasswordPolicyError(ValueError):
    """A password that cannot be used; the message says why (never the password)."""


def hasher() -> PasswordHasher:
    return PasswordHasher.from_parameters(RFC_9106_LOW_MEMORY)


def check_password_policy(password: object) -> str:
    if not isinstance(password, str):
        raise PasswordPolicyError("the password must be a string")
    if len(password) < MIN_PASSWORD_CHARS:
        raise PasswordPolicyError(
            f"the password must have at least {MIN_PASSWORD_CHARS} characters"
        )
    if len(password) > MAX_PASSWORD_CHARS:
        raise PasswordPolicyError(f"the password must have at most {MAX_PASSWORD_CHARS} characters")
    return password


def hash_password(password: str) -> str:
    return hasher().hash(check_password_policy(password))


def verify_password(stored_hash: str, password: str) -> bool:
    try:
        return hasher().verify(stored_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


# A fixed hash to verify against when the user does not exist, so that a login for an unknown
# name costs the same time as one for a known name (no user enumeration by timing).


def dummy_verify(password: str) -> None:
    verify_password(DUMMY_HASH, password)


DUMMY_HASH = (
    "$argon2id$v=19$m=65536,t=3,p=4$9pH2rQ5yrk9SqSP0Rez+/A$"
    "Rsnp/dUWmHnlao0H0En+GtZJ9dZEbbUyRUFqYPgQShU"
)


def generate_password() -> str:
    return secrets.token_urlsafe(18)


def new_bearer_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_random_id(prefix: str, nbytes: int = 8) -> str:
    return f"{prefix}{secrets.token_hex(nbytes)}"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
