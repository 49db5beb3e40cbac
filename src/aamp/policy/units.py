"""Sizes and durations as people write them in a policy (`50MB`, `1GiB`, `15m`, `1h30m`).

Both decimal (kB, MB, GB, TB: powers of 1000) and binary (KiB, MiB, GiB, TiB: powers of 1024)
units are accepted, because people mean different things by "MB" and a policy must not guess:
`50MB` is 50,000,000 bytes and `50MiB` is 52,428,800. Unit letters are case-insensitive
(`50mb` is `50MB`). A bare whole number is bytes (sizes) or seconds (durations).
Every error is a `ValueError` whose message says what was wrong; callers prefix the field path.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MiB = 1024**2
GiB = 1024**3
_SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s?([A-Za-z]+)\Z")
_DURATION_UNITS: dict[str, int] = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_PART_RE = re.compile(r"([0-9]+)([smhd])")
_DURATION_RE = re.compile(r"^(?:[0-9]+[smhd])+\Z")


def _count_or_text(value: object, noun: str, examples: str) -> int | str:
    """A size's or a duration's value as a document gives it: a whole number (never negative)
    as it is, or text to parse; a bool, a fraction or anything else is refused."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a {noun} such as {examples}, got {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"a {noun} cannot be negative, got {value}")
    return value


def parse_size(value: object) -> int:
    """Bytes from `50MB`, `1.5GiB`, `512` (bytes). Refuses negatives, bools and fractions of a
    byte."""
    scalar = _count_or_text(value, "size", "50MB or 1GiB")
    if isinstance(scalar, int):
        return scalar
    text = scalar.strip()
    if text.isdigit():
        return int(text)
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"expected a size such as 50MB or 1GiB, got {value!r}")
    number, unit = match.groups()
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"unknown size unit {unit!r} in {value!r}; use B, kB, MB, GB, TB (powers of 1000) "
            "or KiB, MiB, GiB, TiB (powers of 1024)"
        )
    try:
        exact = Decimal(number) * factor
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        raise ValueError(f"expected a size such as 50MB, got {value!r}") from None
    if exact != exact.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(exact)


def parse_duration(value: object) -> int:
    """Whole seconds from `90s`, `15m`, `1h`, `1h30m`, `2d`, or a bare number of seconds."""
    scalar = _count_or_text(value, "duration", "90s, 15m or 1h")
    if isinstance(scalar, int):
        return scalar
    text = scalar.strip().lower()
    if text.isdigit():
        return int(text)
    if not _DURATION_RE.match(text):
        raise ValueError(f"expected a duration such as 90s, 15m, 1h or 1h30m, got {value!r}")
    units = [unit for _, unit in _DURATION_PART_RE.findall(text)]
    if len(set(units)) != len(units):
        raise ValueError(f"a duration names each unit once, got {value!r}")
    return sum(int(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART_RE.findall(text))
