"""Finding an element's ref in a browser snapshot, the way a model reading it would: by its
exact role and name. Used by the browser tests' scripted calls and by the scripted model
double, whose turns may say `{"$ref": ["button", "Save"]}` where a ref is wanted."""

from __future__ import annotations

import json
import re
from typing import Any

_LINE = re.compile(r'^\s*- (?P<role>[a-z]+)(?: (?P<name>"(?:[^"\\]|\\.)*"))?(?P<rest>.*)$')
_REF = re.compile(r"\[ref=((?:f\d+)?e\d+)\]")


def ref_of(snapshot: str, role: str, name: str | None = None) -> str:
    """The ref of the one element with this role (and exact name) in `snapshot`."""
    found = []
    for line in snapshot.splitlines():
        match = _LINE.match(line)
        if match is None or match["role"] != role:
            continue
        shown = json.loads(match["name"]) if match["name"] else None
        ref = _REF.search(match["rest"])
        if ref is not None and (name is None or shown == name):
            found.append(ref.group(1))
    if len(found) != 1:
        raise LookupError(f"{len(found)} elements {role} {name!r} with a ref in:\n{snapshot}")
    return found[0]


def fill_refs(value: Any, snapshot: str) -> Any:
    """`value` with every {"$ref": [role, name]} replaced by that element's ref."""
    if isinstance(value, dict):
        if set(value) == {"$ref"}:
            return ref_of(snapshot, *value["$ref"])
        return {k: fill_refs(v, snapshot) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_refs(v, snapshot) for v in value]
    return value
