"""Times as stored: RFC 3339, UTC, always with microseconds, e.g. `2025-01-02T03:04:05.000006Z`.

One fixed-width text form means the audit hash covers exactly the text that is stored, and
text comparison orders and filters times correctly on every backend.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # for parsing; `format_time` writes the same
_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z\Z")


def format_time(moment: datetime) -> str:
    """The stored text for an aware datetime (naive ones are refused: their zone is unknown)."""
    if moment.tzinfo is None:
        raise ValueError("a naive datetime has no time zone; pass an aware one (e.g. UTC)")
    m = moment.astimezone(UTC)
    # %-formatting, not strftime (nor an f-string, twice as dear): the same text at a third
    # of strftime's cost (every API request stamps times), the year always four digits.
    return "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (  # noqa: UP031
        m.year,
        m.month,
        m.day,
        m.hour,
        m.minute,
        m.second,
        m.microsecond,
    )


def now() -> str:
    return format_time(datetime.now(UTC))


def time_at(seconds: float) -> str:
    """The stored text for a time given in seconds since the epoch (a `time.time` clock's)."""
    return format_time(datetime.fromtimestamp(seconds, UTC))


def parse_time(text: str) -> datetime:
    if not _RE.match(text):
        raise ValueError(f"not an aamp timestamp (RFC 3339 UTC with microseconds): {text!r}")
    return datetime.strptime(text, _FORMAT).replace(tzinfo=UTC)


def is_time(text: object) -> bool:
    return isinstance(text, str) and _RE.match(text) is not None
