"""The egress ledger: one structured event per connection attempt, allowed or refused.

The proxy hands every `EgressEvent` to an `EgressSink`. The audit log implements the same
one-method protocol (`async def record(event)`), so swapping the file sink for it changes no
proxy code. `record` returns only once the event is durable; the proxy tracks the pending
calls and `EgressProxy.close()` waits for them, so no event is dropped on an orderly stop.

`JsonLinesSink` appends one JSON object per line to a file and fsyncs it. Concurrent events
are group-committed: whichever events arrive while an fsync runs are written and synced
together by the next one, so 200 parallel connections cost a handful of fsyncs, not 200.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class EgressEvent:
    """One attempt. `host` is canonical when it could be parsed (else the raw text, escaped);
    `address` is the resolved address connected to (or refused), None before resolution.
    `decision` is "allowed" or "refused"; `rule` names what decided; `status` is the HTTP status
    the proxy answered with (200 for an established tunnel), `time` a Unix timestamp.
    For a service call (`kind` "service", or an intercepted "connect"), `service` names the
    service and `secrets` the names of the secrets injected — never their values. A connection
    that ended before any request is one event of kind "idle" (nothing sent, or nothing before
    the idle timeout) or "malformed" (a partial head), decision "refused"."""

    sandbox_id: str
    time: float
    connection: int
    kind: str  # "connect" | "http" | "service" | "malformed" | "overload" | "idle"
    host: str
    port: int | None
    address: str | None
    decision: str
    rule: str
    reason: str
    status: int
    bytes_up: int
    bytes_down: int
    duration: float
    service: str | None = None
    secrets: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.decision == "allowed"

    def to_dict(self) -> dict[str, Any]:
        """The event's fields by name. Every field is a scalar or a tuple of strings, so this
        is `dataclasses.asdict` without its deep copy (a third of a small request's cost)."""
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=True)


_FIELD_NAMES = tuple(f.name for f in fields(EgressEvent))
# Every `kind` and `decision` a proxy writes (`proxy.py`; "cut": a tunnel cut mid-way): a
# record from a host with any other is not taken (`aamp.fleet.reports`).
EVENT_KINDS = ("connect", "http", "service", "malformed", "overload", "idle")
EVENT_DECISIONS = ("allowed", "refused", "cut")


class EgressSink(Protocol):
    async def record(self, event: EgressEvent) -> None:
        """Persist `event`; return only once it is durable."""
        ...


class JsonLinesSink:
    """Append-only JSON lines with fsync; group commit for concurrent events."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def record(self, event: EgressEvent) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(((event.to_json() + "\n").encode("ascii"), future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            data = b"".join(line for line, _ in batch)
            try:
                await asyncio.to_thread(self._append, data)
            except OSError as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for _, future in batch:
                if not future.done():
                    future.set_result(None)

    def _append(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> list[EgressEvent]:
        """Every event in the file (for tests and `aamp audit` tooling)."""
        if not self.path.exists():
            return []
        with self.path.open(encoding="ascii") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        return [EgressEvent(**{**row, "secrets": tuple(row.get("secrets", ()))}) for row in rows]


class AuditEgressSink:
    """The egress ledger as audit records: one `egress.connect` per attempt, allowed or
    refused, with the rule that decided and the bytes each way. `audit` is an
    `aamp.audit.AuditSink`; it returns once the record is durable. `host` names the sandbox
    host on another machine whose proxy decided (its events reach the chain over the link)."""

    def __init__(self, audit: Any, host: str | None = None):
        self._audit = audit
        self._host = host

    async def record(self, event: EgressEvent) -> None:
        details = event.to_dict()
        if self._host is not None:  # `host` is the destination's
            details["sandbox_host"] = self._host
        await self._audit.record(
            actor=f"sandbox:{event.sandbox_id}",
            action=f"egress.{event.kind}",
            resource=f"host:{event.host}:{event.port}",
            decision="allow" if event.allowed else "deny",
            reason=event.rule,
            details=details,
        )
