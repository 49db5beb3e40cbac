"""A run's step log: every step is stored first (the live stream reads the store), then
audited, then announced to live readers — in that order, so that nothing a reader was shown
can be missing from the store or the audit log after a crash.
"""

from __future__ import annotations

from typing import Any

from aamp.audit.record import AuditSink
from aamp.runs.bus import EventBus
from aamp.runs.store import RunEvent, RunStore
from aamp.store import Store

AUDIT_TEXT_CHARS = 4000


def audit_details(type_: str, data: dict[str, Any]) -> dict[str, Any]:
    """The step as the audit log keeps it: everything but screenshots' pixels, long texts cut."""
    details = {k: v for k, v in data.items() if k != "png_b64"}
    for key in ("text", "content", "answer"):
        value = details.get(key)
        if isinstance(value, str) and len(value) > AUDIT_TEXT_CHARS:
            details[key] = value[:AUDIT_TEXT_CHARS] + f"... [{len(value)} chars]"
    return details


class StepLog:
    def __init__(self, store: Store, runs: RunStore, audit: AuditSink, bus: EventBus) -> None:
        self.store = store
        self.runs = runs
        self.audit = audit
        self.bus = bus

    async def emit(self, run_id: str, type_: str, data: dict[str, Any]) -> RunEvent:
        """Store a step, audit it, wake live readers. A `model.call` step also adds its
        tokens to the run's counters."""
        event = await self.store.run(self.runs.append_event, run_id, type_, data)
        if type_ == "model.call":
            await self.store.run(self._count, run_id, data)
        await self.audit.record(
            actor=f"run:{run_id}",
            action=f"run.{type_}",
            resource=f"run:{run_id}",
            decision="info",
            details={"seq": event.seq, **audit_details(type_, data)},
        )
        self.bus.notify(run_id)
        return event

    def _count(self, run_id: str, data: dict[str, Any]) -> None:
        run = self.runs.get(run_id)
        self.runs.update(
            run_id,
            steps=run.steps + 1,
            prompt_tokens=run.prompt_tokens + int(data.get("prompt_tokens") or 0),
            completion_tokens=run.completion_tokens + int(data.get("completion_tokens") or 0),
        )
