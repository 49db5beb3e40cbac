"""`RecentEgress`: every event still reaches the ledger; a watched sandbox's latest events can
be read back from a mark, within a bound, and are dropped when the sandbox is forgotten."""

from __future__ import annotations

import time

from aamp.egress.ledger import EgressEvent
from aamp.egress.recent import RecentEgress


class ListLedgerForTests:
    def __init__(self) -> None:
        self.events: list[EgressEvent] = []

    async def record(self, event: EgressEvent) -> None:
        self.events.append(event)


def event(sandbox: str, host: str) -> EgressEvent:
    return EgressEvent(
        sandbox, time.time(), 1, "connect", host, 443, None, "refused", "default: block",
        "no rule", 403, 0, 0, 0.0,
    )  # fmt: skip


async def test_events_pass_on_and_a_watched_sandbox_reads_what_came_after_its_mark() -> None:
    ledger = ListLedgerForTests()
    recent = RecentEgress(ledger, kept=3)
    await recent.record(event("sb-a", "before.test"))  # not watched yet: only the ledger has it
    view = recent.view("sb-a")
    other = recent.view("sb-b")
    mark = await view.mark()
    await recent.record(event("sb-a", "one.test"))
    await recent.record(event("sb-b", "elsewhere.test"))
    await recent.record(event("sb-a", "two.test"))
    assert [e.host for e in await view.since(mark)] == ["one.test", "two.test"]
    assert [e.host for e in await other.since(0)] == ["elsewhere.test"]
    assert [e.host for e in await view.since(await view.mark())] == []
    for n in range(5):
        await recent.record(event("sb-a", f"many{n}.test"))
    assert [e.host for e in await view.since(mark)] == ["many2.test", "many3.test", "many4.test"]
    assert len(ledger.events) == 9
    recent.forget("sb-a")
    await recent.record(event("sb-a", "after.test"))
    assert await recent.view("sb-a").since(0) == [] and len(ledger.events) == 10
