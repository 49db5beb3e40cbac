"""What a shown value's dict form is: its fields, for the API to answer and the audit log to
record.

A frozen dataclass the product shows derives from `Shown` and so needs no `to_dict` of its
own; `hidden` names the fields that stay inside (a database id). Enum members become their
values, so the dict holds only JSON's own types. This module imports nothing of aamp.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any, ClassVar

# Immutable values `asdict` would copy to themselves.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {name: value.value if isinstance(value, Enum) else value for name, value in items}


class Shown:
    """Base of a dataclass whose `to_dict()` is its fields, less those named in `hidden`."""

    hidden: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        items = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]  # type: ignore[arg-type]
        if all(type(value) in _SCALARS or isinstance(value, Enum) for _, value in items):
            # Only scalars (most shown values, an agent read by every API request): the
            # fields as they are. `asdict` would deep-copy each one, at many times the cost.
            data = _plain(items)
        else:
            data = dataclasses.asdict(self, dict_factory=_plain)  # type: ignore[call-overload]
        for name in self.hidden:
            del data[name]
        return data
