"""What an audit record is, what callers may put in one, and the sink interface they call.

Callers (the API, sandbox lifecycle, exec, file transfer, the egress ledger, the vault) depend
only on `AuditSink`; `AuditLog` is the implementation that makes it durable and chained.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NotRequired, Protocol, TypedDict, Unpack, get_type_hints

import typing_extensions

from aamp.audit.canonical import canonical_json, record_hash

MAX_DETAILS_BYTES = 64 * 1024
_DECISION_RE = re.compile(r"^[a-z][a-z_]{0,31}\Z")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_LIMITS = {"actor": 256, "action": 128, "resource": 512, "request_id": 128}
MAX_REASON_CHARS = 4096
# The columns of `audit_records`, in order: a record as it is stored, exported and verified.
RECORD_COLUMNS = (
    "seq",
    "time",
    "actor",
    "action",
    "resource",
    "decision",
    "reason",
    "request_id",
    "details",
    "prev_hash",
    "hash",
)


class Decision(StrEnum):
    """Usual decisions; any lowercase word matching `[a-z][a-z_]{0,31}` is accepted."""

    ALLOW = "allow"
    DENY = "deny"
    ERROR = "error"
    INFO = "info"


class AuditInputError(ValueError):
    """An audit event was refused before anything was written; the message names the field."""


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """A validated event, ready for the writer (details already canonical JSON text)."""

    actor: str
    action: str
    resource: str
    decision: str
    reason: str | None
    request_id: str | None
    details_json: str


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """A committed record: the event plus its place in the chain."""

    seq: int
    time: str
    actor: str
    action: str
    resource: str
    decision: str
    reason: str | None
    request_id: str | None
    details_json: str = field(repr=False)
    prev_hash: str
    hash: str

    @classmethod
    def chained(cls, seq: int, time: str, event: AuditEvent, prev_hash: str) -> AuditRecord:
        """`event` as record `seq`, following the record whose hash is `prev_hash`."""
        fields = (
            seq,
            time,
            event.actor,
            event.action,
            event.resource,
            event.decision,
            event.reason,
            event.request_id,
            event.details_json,
            prev_hash,
        )
        return cls(*fields, record_hash(*fields))

    @property
    def details(self) -> dict[str, Any]:
        return json.loads(self.details_json)  # type: ignore[no-any-return]

    def row(self) -> tuple[Any, ...]:
        """The record's values in `RECORD_COLUMNS` order (`details` as its canonical JSON)."""
        return (
            self.seq,
            self.time,
            self.actor,
            self.action,
            self.resource,
            self.decision,
            self.reason,
            self.request_id,
            self.details_json,
            self.prev_hash,
            self.hash,
        )

    def to_dict(self) -> ShownRecord:
        """The record as a JSON-ready dict (the export and API form, `ShownRecord`)."""
        return {**dict(zip(RECORD_COLUMNS, self.row(), strict=True)), "details": self.details}


# A record as people and other tools read it (the API's answer, an export's line): the stored
# columns in order, with `details` the object its canonical JSON encodes. Derived from
# `AuditRecord`, so the two cannot drift apart.
_HINTS = get_type_hints(AuditRecord)
ShownRecord = typing_extensions.TypedDict(  # type: ignore[misc]  # pydantic reads it (3.11)
    "ShownRecord",
    {c: dict[str, Any] if c == "details" else _HINTS[c] for c in RECORD_COLUMNS},
)


class EventFields(TypedDict):
    """What a caller records: `make_event` says what each field must be."""

    actor: str
    action: str
    resource: str
    decision: str
    reason: NotRequired[str | None]
    request_id: NotRequired[str | None]
    details: NotRequired[Mapping[str, Any] | None]


_EVENT_FIELDS = frozenset(EventFields.__annotations__)


class AuditSink(Protocol):
    """The one interface other parts record through. Returns only once the record is durable.

    Example::

        await audit.record(actor="user:alice", action="sandbox.exec",
                           resource="sandbox:sb-0123456789ab", decision="allow",
                           reason="grant run on agent finance", request_id=req_id,
                           details={"argv": ["python", "x.py"], "exit": 0})
    """

    async def record(self, **event: Unpack[EventFields]) -> AuditRecord: ...


def recordable(field: str, value: str) -> str:
    """`value` — text a caller did not choose, such as a request's path — as audit field
    `field` takes it: control characters written as `\\xNN` and cut to the field's limit, so
    the refusal that names it is recorded instead of failing as bad audit input."""
    escaped = _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", value)
    return escaped[: _LIMITS[field]]


def _text(name: str, value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise AuditInputError(f"audit field {name!r} must be a non-empty string")
    limit = _LIMITS.get(name)
    if limit is not None and len(value) > limit:
        raise AuditInputError(f"audit field {name!r} is longer than {limit} characters")
    if _CONTROL_RE.search(value):
        raise AuditInputError(f"audit field {name!r} contains a control character")
    if not value.isascii():  # ASCII always encodes; only other text can hold a lone surrogate
        _utf8(name, value)
    return value


def _utf8(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise AuditInputError(f"audit field {name!r} is not valid Unicode") from None


def make_event(fields: EventFields) -> AuditEvent:
    """Validate what a caller records (clear `AuditInputError` naming the field; nothing is
    written): the fields of `EventFields`, no others."""
    unknown = fields.keys() - _EVENT_FIELDS
    if unknown:
        raise AuditInputError(f"{sorted(unknown)[0]!r} is not an audit field")
    decision = fields.get("decision")
    reason = fields.get("reason")
    details = fields.get("details")
    if not isinstance(decision, str) or not _DECISION_RE.match(decision):
        raise AuditInputError(
            "audit field 'decision' must be a lowercase word like 'allow' or 'deny'"
        )
    if reason is not None:
        if not isinstance(reason, str):
            raise AuditInputError("audit field 'reason' must be a string or None")
        if len(reason) > MAX_REASON_CHARS or "\x00" in reason:
            raise AuditInputError(
                f"audit field 'reason' must be at most {MAX_REASON_CHARS} characters, no NUL"
            )
    if details is None:
        details = {}
    if not isinstance(details, Mapping):
        raise AuditInputError("audit field 'details' must be a JSON object (a mapping)")
    try:
        details_json = canonical_json(dict(details))
        encoded = details_json.encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise AuditInputError(f"audit field 'details' is not encodable as JSON: {exc}") from None
    if len(encoded) > MAX_DETAILS_BYTES:
        raise AuditInputError(f"audit field 'details' is larger than {MAX_DETAILS_BYTES} bytes")
    if reason is not None:
        _utf8("reason", reason)
    return AuditEvent(
        actor=_text("actor", fields.get("actor")),  # type: ignore[arg-type]
        action=_text("action", fields.get("action")),  # type: ignore[arg-type]
        resource=_text("resource", fields.get("resource")),  # type: ignore[arg-type]
        decision=decision,
        reason=reason,
        request_id=_text("request_id", fields.get("request_id"), optional=True),
        details_json=details_json,
    )
