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


def _plain(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {name: value.value if isinstance(value, Enum) else value for name, value in items}


class Shown:
    """Base of a dataclass whose `to_dict()` is its fields, less those named in `hidden`."""

    hidden: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self, dict_factory=_plain)  # type: ignore[call-overload]
        for name in self.hidden:
            del data[name]
        return data
