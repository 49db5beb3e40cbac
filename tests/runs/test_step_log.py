"""`StepLog`: a step is in the audit log before any reader can see it in the store, numbered
without gaps and in order under concurrent emits, with exact counters; a restarted process
numbers on from the store; a cancelled emit still stores the step it audited.

Real store (SQLite file and a real PostgreSQL server), real audit log; no sandboxes.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import db_fixtures
import pytest
from sqlalchemy import text

from aamp.audit import AuditLog
from aamp.audit.record import AuditRecord
from aamp.errors import Conflict
from aamp.runs.bus import EventBus
from aamp.runs.leases import LeaseLost, RunLeases
from aamp.runs.steps import StepLog
from aamp.runs.store import RunStore
from aamp.store import Store

# The store fixtures (a SQLite file, and a database of the real PostgreSQL server).
settings = db_fixtures.settings
store = db_fixtures.store
audit = db_fixtures.audit


class GatedAuditForTests:
    """The real audit log, except that each record waits at a gate the test opens, so a test
    can look at the store while a step's audit record is still on its way."""

    def __init__(self, log: AuditLog) -> None:
        self.log = log
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def record(self, **fields: Any) -> AuditRecord:
        self.waiting.set()
        await self.gate.wait()
        return await self.log.record(**fields)


def _run(store: Store) -> str:
    with store.write_connection() as conn:
        conn.execute(
            text("INSERT INTO agents (id, name, owner, created_at) VALUES ('ag1', 'a', 'u', 't')")
        )
    return RunStore(store).create("ag1", 1, "u", "a task").id


def _audited(store: Store, run_id: str) -> list[tuple[str, int]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT action, details FROM audit_records WHERE resource = :r ORDER BY seq"),
            {"r": f"run:{run_id}"},
        )
        return [(action, json.loads(details)["seq"]) for action, details in rows]


def _call(prompt: int, completion: int) -> dict[str, Any]:
    return {"step": 1, "prompt_tokens": prompt, "completion_tokens": completion}


async def test_concurrent_emits_are_numbered_in_order_with_exact_counters(
    store: Store, audit: AuditLog
) -> None:
    run_id = _run(store)
    runs = RunStore(store)
    log = StepLog(store, runs, audit, EventBus())
    emits = [
        log.emit(run_id, "model.call", _call(i, 2 * i))
        if i % 2
        else log.emit(run_id, "tool.call", {"i": i})
        for i in range(60)
    ]
    events = await asyncio.gather(*emits)
    # Numbered in the order the emits came, and stored so.
    assert [e.seq for e in events] == list(range(1, 61))
    stored = runs.events_after(run_id, 0)
    assert [(e.seq, e.type, e.data) for e in stored] == [(e.seq, e.type, e.data) for e in events]
    run = runs.get(run_id)
    odd = range(1, 60, 2)
    assert (run.steps, run.prompt_tokens, run.completion_tokens) == (
        len(odd),
        sum(odd),
        2 * sum(odd),
    )
    # Audited in the same order, one record per step.
    assert [seq for _, seq in _audited(store, run_id)] == list(range(1, 61))


async def test_a_step_is_audited_before_a_reader_can_see_it(store: Store, audit: AuditLog) -> None:
    run_id = _run(store)
    runs = RunStore(store)
    gated = GatedAuditForTests(audit)
    bus = EventBus()
    log = StepLog(store, runs, gated, bus)
    woken = bus.waiter(run_id)
    emitting = asyncio.create_task(log.emit(run_id, "run.started", {"policy": "p"}))
    await asyncio.wait_for(gated.waiting.wait(), 5)
    await asyncio.sleep(0.05)  # time enough for a store write, were it under way
    assert runs.events_after(run_id, 0) == [] and not woken.is_set()
    gated.gate.set()
    event = await emitting
    # Once emit returns: audited (durably: committed), stored, and readers woken.
    assert _audited(store, run_id) == [("run.run.started", 1)]
    assert [(e.seq, e.type) for e in runs.events_after(run_id, 0)] == [(1, "run.started")]
    assert event.seq == 1 and woken.is_set()


async def test_a_new_process_numbers_on_from_the_store(store: Store, audit: AuditLog) -> None:
    run_id = _run(store)
    runs = RunStore(store)
    first = StepLog(store, runs, audit, EventBus())
    for _ in range(3):
        await first.emit(run_id, "tool.call", {})
    restarted = StepLog(store, runs, audit, EventBus())  # knows nothing of the run
    event = await restarted.emit(run_id, "run.finished", {"status": "failed"})
    assert event.seq == 4
    assert [e.seq for e in runs.events_after(run_id, 0)] == [1, 2, 3, 4]


async def test_a_step_audited_but_never_stored_keeps_its_number(
    store: Store, audit: AuditLog
) -> None:
    """kill -9 between a step's audit record and its store write: the restarted process
    numbers after the audited step, so no number appears twice in the audit log."""
    run_id = _run(store)
    runs = RunStore(store)
    first = StepLog(store, runs, audit, EventBus())
    for _ in range(2):
        await first.emit(run_id, "tool.call", {})
    key = f"run:{run_id}"  # step 3 as the dead process audited it, never stored
    await audit.record(
        actor=key, action="run.tool.call", resource=key, decision="info", details={"seq": 3}
    )
    restarted = StepLog(store, runs, audit, EventBus())
    event = await restarted.emit(run_id, "run.finished", {"status": "failed"})
    assert event.seq == 4
    assert [seq for _, seq in _audited(store, run_id)] == [1, 2, 3, 4]


async def test_a_cancelled_emit_still_stores_what_it_audited(store: Store, audit: AuditLog) -> None:
    run_id = _run(store)
    runs = RunStore(store)
    gated = GatedAuditForTests(audit)
    log = StepLog(store, runs, gated, EventBus())
    emitting = asyncio.create_task(log.emit(run_id, "tool.call", {"n": 1}))
    await asyncio.wait_for(gated.waiting.wait(), 5)
    emitting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await emitting
    gated.gate.set()
    finished = await log.emit(run_id, "run.finished", {"status": "cancelled"})
    assert finished.seq == 2
    assert [(e.seq, e.type) for e in runs.events_after(run_id, 0)] == [
        (1, "tool.call"),
        (2, "run.finished"),
    ]
    assert _audited(store, run_id) == [("run.tool.call", 1), ("run.run.finished", 2)]


async def test_a_number_given_twice_is_refused_and_changes_nothing(store: Store) -> None:
    run_id = _run(store)
    runs = RunStore(store)
    runs.append_event(run_id, 1, "model.call", _call(5, 7), (1, 5, 7))
    with pytest.raises(Conflict, match=f"step 1 of run {run_id} refused"):
        runs.append_event(run_id, 1, "model.call", _call(100, 100), (1, 100, 100))
    assert [e.data for e in runs.events_after(run_id, 0)] == [_call(5, 7)]
    run = runs.get(run_id)
    assert (run.steps, run.prompt_tokens, run.completion_tokens) == (1, 5, 7)
    assert runs.last_seq(run_id) == 1


async def test_a_fenced_out_step_is_refused_before_its_audit_or_audited_as_refused(
    store: Store, audit: AuditLog
) -> None:
    run_id = _run(store)
    runs = RunStore(store)
    mine = RunLeases(store, "replica-a", seconds=60)
    mine.take(run_id)
    log = StepLog(store, runs, audit, EventBus(), mine.fence)
    await log.emit(run_id, "run.started", {})
    # Another replica, whose clock says this one's lease expired long ago, takes the run.
    other = RunLeases(store, "replica-b", seconds=60, clock=lambda: time.time() + 3600)
    assert other.claim_expired() == (run_id, "replica-a")

    # This replica does not know yet: the step is audited, refused, and the refusal audited.
    with pytest.raises(LeaseLost):
        await log.emit(run_id, "model.call", _call(1, 1))
    assert _audited(store, run_id) == [
        ("run.run.started", 1),
        ("run.model.call", 2),
        ("run.step_refused", 2),
    ]
    with store.engine.connect() as conn:
        decision, reason = conn.execute(
            text("SELECT decision, reason FROM audit_records WHERE action = 'run.step_refused'")
        ).one()
    assert decision == "deny" and "replica-b" in reason

    # Once its renewal said so, a step is refused before anything of it is audited.
    assert mine.renew({run_id}) == {run_id}
    with pytest.raises(LeaseLost, match="taken over"):
        await log.emit(run_id, "model.call", _call(1, 1))
    assert len(_audited(store, run_id)) == 3
    assert [e.seq for e in runs.events_after(run_id, 0)] == [1]
