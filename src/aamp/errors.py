"""The errors every part of aamp raises for a request it cannot serve as asked.

Each carries a stable `code` and the HTTP `status` the API answers with (`aamp.api.errors`
turns any `AampError` into `{code, message}`), and a message for people that names what is
wrong. A package that needs its own kind derives it from `AampError`, naming its code and
status in the class line (`class Throttled(AampError, code="too_many_attempts",
status=429)`). `matching` checks a text against its rule. This module imports nothing of
aamp, so any part may use it.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

T = TypeVar("T")


class AampError(Exception):
    code = "invalid_request"
    status = 400

    def __init_subclass__(
        cls, *, code: str | None = None, status: int | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if status is not None:
            cls.status = status


class InvalidInput(AampError, ValueError):
    """The input is not valid; the message names the field and the rule."""


def matching(value: object, pattern: re.Pattern[str], message: str) -> str:
    """`value` if it is text that `pattern` matches; else `InvalidInput(message)`. The one way
    a name, an id or a header is checked against its rule."""
    if not isinstance(value, str) or not pattern.match(value):
        raise InvalidInput(message)
    return value


class NotFound(AampError, code="not_found", status=404):
    """What the request names does not exist; the message names it."""


def found(value: T | None, missing: str) -> T:
    """`value` if a lookup found it; else `NotFound(missing)`. The one way a lookup that came
    back empty becomes the answer "there is no such thing"."""
    if value is None:
        raise NotFound(missing)
    return value


class Conflict(AampError, code="conflict", status=409):
    """The request conflicts with what exists (a name taken, a state already left)."""
