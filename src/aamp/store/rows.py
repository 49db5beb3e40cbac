"""A frozen value built from a table row: each field of the value from the row's column of the
same name, except those the caller converts (a column kept as JSON text, a 0/1 flag).

Usage::

    value_of(RunInfo, row)
    value_of(Service, row, auth=row.auth_kind, secrets=tuple(json.loads(row.secret_names)))
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def value_of(kind: type[T], row: object, **given: Any) -> T:
    """`kind` (a dataclass) from `row`: `given` values first, the rest by column name."""
    names = (f.name for f in dataclasses.fields(kind) if f.init)  # type: ignore[arg-type]
    return kind(**{n: given[n] if n in given else getattr(row, n) for n in names})
