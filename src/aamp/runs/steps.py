"""A run's step log: every step is audited first, then stored (the live stream reads the
store), then announced to live readers — in that order, so that nothing a reader could see can
be missing from the store or the audit log after a crash (kill -9 included).

Why audit first: a reader sees a step as soon as it is stored (it polls the store, the bus
only wakes it sooner), so storing first left a moment in which a client could receive a step
the audit log had not yet made durable. Auditing first needs the step's number before it is
stored; `StepLog` keeps the next number of each run it writes (only one process writes a live
run's steps) and numbers a run's steps one at a time, so they are stored in order with no gap.
A run it has not seen yet (a restart's `recover()`) starts from the store's newest step.

A step whose audit record was written is then stored even if the caller is cancelled half-way
(the write is shielded), so a cancelled run's next step never reuses the number.

A step is stored under the lease this replica holds on the run (`fence_of`), if any: a
replica another one fenced out gets `LeaseLost` and stores nothing (the run's new driver
numbers on from the store and the audit log, so no number is stored twice). Once this replica
knows it lost the lease (its renewal said so), a step is refused before it is audited. A
stalled replica that does not know yet has its step audited, then refused by the store: it
then audits the refusal (`run.step_refused`, decision deny, the step's number and type), so
the audit log never shows a step of a fenced-out replica as if it had been stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aamp.audit.record import AuditSink
from aamp.runs.bus import EventBus
from aamp.runs.leases import Fence, LeaseLost
from aamp.runs.store import RunEvent, RunStore
from aamp.store import Store

AUDIT_TEXT_CHARS = 4000
FINAL_STEP = "run.finished"


def audit_details(type_: str, data: dict[str, Any]) -> dict[str, Any]:
    """The step as the audit log keeps it: everything but screenshots' pixels, long texts cut."""
    details = {k: v for k, v in data.items() if k != "png_b64"}
    for key in ("text", "content", "answer"):
        value = details.get(key)
        if isinstance(value, str) and len(value) > AUDIT_TEXT_CHARS:
            details[key] = value[:AUDIT_TEXT_CHARS] + f"... [{len(value)} chars]"
    return details


def counts(type_: str, data: dict[str, Any]) -> tuple[int, int, int] | None:
    """What a step adds to its run's counters (steps, prompt and completion tokens): a
    `model.call` is one step with its tokens; other steps add nothing."""
    if type_ != "model.call":
        return None
    return 1, int(data.get("prompt_tokens") or 0), int(data.get("completion_tokens") or 0)


@dataclass
class _Tail:
    """The writing end of one run's step log in this process."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    next_seq: int | None = None  # None: ask the store
    users: int = 0  # emits holding or waiting for the lock


@dataclass(eq=False)
class StepLog:
    """Every run's step log as this process writes it: audited, stored, announced."""

    store: Store
    runs: RunStore
    audit: AuditSink
    bus: EventBus
    fence_of: Callable[[str], Fence | None] = lambda _run_id: None
    _tails: dict[str, _Tail] = field(default_factory=dict, init=False, repr=False)

    async def emit(self, run_id: str, type_: str, data: dict[str, Any]) -> RunEvent:
        """Audit a step, store it, wake live readers; returns once all three are done. A
        `model.call` step also adds its tokens to the run's counters (same transaction)."""
        tail = self._tails.setdefault(run_id, _Tail())
        tail.users += 1  # counted here, released by `_write`, which outlives a cancelled caller
        return await asyncio.shield(self._write(run_id, tail, type_, data))

    async def _write(self, run_id: str, tail: _Tail, type_: str, data: dict[str, Any]) -> RunEvent:
        try:
            async with tail.lock:
                seq = tail.next_seq
                if seq is None:
                    seq = await self.store.run(self.runs.last_seq, run_id) + 1
                tail.next_seq = None  # until this step is stored: on failure, ask the store
                fence = self.fence_of(run_id)
                if fence is not None and fence.lost:
                    raise LeaseLost(
                        f"run {run_id}: {fence.replica}'s lease {fence.epoch} was taken over"
                    )
                await self.audit.record(
                    actor=f"run:{run_id}",
                    action=f"run.{type_}",
                    resource=f"run:{run_id}",
                    decision="info",
                    details={"seq": seq, **audit_details(type_, data)},
                )
                try:
                    event = await self.store.run(
                        self.runs.append_event,
                        run_id,
                        seq,
                        type_,
                        data,
                        counts(type_, data),
                        fence,
                    )
                except LeaseLost as refused:
                    await self.audit.record(
                        actor=f"run:{run_id}",
                        action="run.step_refused",
                        resource=f"run:{run_id}",
                        decision="deny",
                        reason=str(refused),
                        details={"seq": seq, "type": type_},
                    )
                    raise
                tail.next_seq = seq + 1
        finally:
            tail.users -= 1
            if tail.users == 0 and type_ == FINAL_STEP:
                self._tails.pop(run_id, None)  # a late step starts again from the store
        self.bus.notify(run_id)
        return event
