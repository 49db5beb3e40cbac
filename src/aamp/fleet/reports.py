"""What a replica takes from a sandbox host's own word, field by field: the egress events and
secret-use records of its collect answers (`collector.py`) and its descriptions of sandboxes
(`link_client.py`, shown to API clients and put in `sandbox.create` records).

A host is untrusted for what it reports. Each field has a type and a bound; `kind` and
`decision` are of closed sets (what a proxy writes: `aamp.egress.ledger`); a service named must
be one the sandbox's create was granted. A record with anything else is not taken
(`NotTaken`, saying why, for the caller's one `host.report_refused` record). A description
keeps only the keys a sandbox's own description has (`Sandbox.describe`), each of its type and
size: a key of the wrong type refuses the whole description, a key not on the list is dropped
and named, for the caller to record.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

from aamp.egress.ledger import EVENT_DECISIONS, EVENT_KINDS, EgressEvent

MAX_TEXT = 300  # a host name, a rule, an image, a driver
MAX_REASON = 1000
MAX_NAMES = 16  # secrets of one service, methods of one use, packages named
MAX_NAME = 64
MAX_COUNT = 2**53  # a JSON number still exact as a float
MAX_SECONDS = 10 * 365 * 86400.0


class NotTaken(ValueError):
    """A host's record or description, refused; the message says which field and why."""


Check = Callable[[str, object], object]


# A host's text reaches API clients, terminals and the audit chain: no control characters.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def text(limit: int = MAX_TEXT, *, none: bool = False, empty: bool = True) -> Check:
    def check(name: str, value: object) -> object:
        if value is None and none:
            return None
        if not isinstance(value, str) or len(value) > limit or _CONTROL.search(value):
            raise NotTaken(
                f"{name} is not text of at most {limit} characters without control characters"
            )
        if not empty and not value:
            raise NotTaken(f"{name} is empty")
        return value

    return check


def one_of(allowed: Collection[str]) -> Check:
    def check(name: str, value: object) -> object:
        if value not in allowed:
            raise NotTaken(f"{name} {str(value)[:32]!r} is not one of {', '.join(allowed)}")
        return value

    return check


def count(limit: int = MAX_COUNT, *, none: bool = False) -> Check:
    def check(name: str, value: object) -> object:
        if value is None and none:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise NotTaken(f"{name} is not a whole number from 0 to {limit}")
        return value

    return check


def seconds(limit: float = MAX_SECONDS) -> Check:
    def check(name: str, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise NotTaken(f"{name} is not a number")
        if not 0 <= value <= limit:  # NaN fails too
            raise NotTaken(f"{name} is not from 0 to {limit:g}")
        return value

    return check


def flag(name: str, value: object) -> object:
    if not isinstance(value, bool):
        raise NotTaken(f"{name} is not true or false")
    return value


def names(limit: int = MAX_NAMES) -> Check:
    def check(name: str, value: object) -> object:
        if not isinstance(value, list | tuple) or len(value) > limit:
            raise NotTaken(f"{name} is not a list of at most {limit} names")
        for item in value:
            text(MAX_NAME, empty=False)(f"an item of {name}", item)
        return list(value)

    return check


def counts(limit: int = MAX_NAMES) -> Check:
    def check(name: str, value: object) -> object:
        if not isinstance(value, dict) or len(value) > limit:
            raise NotTaken(f"{name} is not an object of at most {limit} counts")
        for key, item in value.items():
            text(MAX_NAME, empty=False)(f"a key of {name}", key)
            count()(f"{name}[{key[:MAX_NAME]}]", item)
        return dict(value)

    return check


def fields(
    what: str, body: object, shape: dict[str, Check], *, extra: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """`body`'s fields, each checked by its `shape`; every field of `shape` must be there.
    Others refuse it, or with `extra` are left out and named (the second value)."""
    if not isinstance(body, dict):
        raise NotTaken(f"{what} is not a JSON object")
    # Escaped: a key is the host's text, and the refusal naming it must stay recordable.
    others = sorted(
        str(k).encode("unicode_escape").decode()[:MAX_NAME] for k in body if k not in shape
    )
    if others and not extra:
        raise NotTaken(f"{what} has fields no such record has: {', '.join(others[:8])}")
    missing = [k for k in shape if k not in body]
    if missing:
        raise NotTaken(f"{what} lacks {', '.join(missing)}")
    return {k: check(f"{what}: {k}", body[k]) for k, check in shape.items()}, others


def egress_event(body: object, granted: Collection[str]) -> EgressEvent:
    """The egress event a host's proxy reported, its service one of `granted`."""
    shape: dict[str, Check] = {
        "sandbox_id": text(MAX_NAME),
        "time": seconds(MAX_COUNT),
        "connection": count(),
        "kind": one_of(EVENT_KINDS),
        "host": text(),
        "port": count(65535, none=True),
        "address": text(MAX_NAME, none=True),
        "decision": one_of(EVENT_DECISIONS),
        "rule": text(),
        "reason": text(MAX_REASON),
        "status": count(999),
        "bytes_up": count(),
        "bytes_down": count(),
        "duration": seconds(),
        "service": text(MAX_NAME, none=True),
        "secrets": names(),
    }
    got, _ = fields("an egress event", body, shape)
    service = got["service"]
    if service is not None and service not in granted:
        raise NotTaken(f"an egress event names service {service}, not granted to the sandbox")
    if got["secrets"] and service is None:
        raise NotTaken("an egress event names secrets but no service")
    return EgressEvent(**{**got, "secrets": tuple(got["secrets"])})


def secret_use(body: object, granted: Collection[str]) -> dict[str, Any]:
    """The secret-use record a host's proxy reported (`LinkSecrets.record_use`): `sandbox`,
    `service` (one of `granted`), `purpose` and the use's counts in `details`."""
    shape: dict[str, Check] = {
        "sandbox": text(MAX_NAME),
        "service": text(MAX_NAME, empty=False),
        "purpose": text(MAX_REASON, empty=False),
        "details": lambda name, value: value,
    }
    got, _ = fields("a secret-use record", body, shape)
    if got["service"] not in granted:
        raise NotTaken(f"a secret-use record names service {got['service']}, not granted")
    details, _ = fields(
        "a secret-use record's details",
        got["details"],
        {
            "service": one_of((got["service"],)),
            "secrets": names(),
            "requests": count(),
            "methods": counts(),
            "reads": count(),
        },
    )
    return {**got, "details": details}


RESOURCES: dict[str, Check] = {
    "cpus": seconds(1024),
    "memory_bytes": count(),
    "pids": count(),
    "disk_bytes": count(),
}
DESCRIPTION: dict[str, Check] = {
    "id": text(MAX_NAME),
    "image": text(),
    "image_hash": text(MAX_NAME, none=True),
    "packages": names(64),
    "driver": text(MAX_NAME),
    "created_at": seconds(MAX_COUNT),
    "ttl_seconds": seconds(),
    "idle_seconds": seconds(),
    "expires_in": seconds(),
    "warm": flag,
    "resources": lambda name, value: fields(name, value, RESOURCES)[0],
}
# The keys a description may lack (a host of an older release); `id`, `image` and `driver`
# must be there.
OPTIONAL = frozenset(DESCRIPTION) - {"id", "image", "driver"}


def description(info: object) -> tuple[dict[str, Any], list[str]]:
    """A host's description of a sandbox, only the keys a sandbox's description has; the
    keys left out are named (the second value). `host` is the replica's to say."""
    if not isinstance(info, dict):
        raise NotTaken("a sandbox's description is not a JSON object")
    shape = {k: c for k, c in DESCRIPTION.items() if k in info or k not in OPTIONAL}
    return fields("a sandbox's description", {k: v for k, v in info.items() if k != "host"},
                  shape, extra=True)  # fmt: skip
