"""The questions a run puts to people — an artifact above its policy's approval size, an
`egress.default: ask` destination — asked and answered in the approval's row: any replica
answers one, and the run's driver, waiting on that row, goes on.

`RunApprovals` is a part of `RunService` (`service.py`), moved here unchanged: its methods
use the service's store, runs, bus, leases and live runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from aamp.egress.approvals import Answer, Approver
from aamp.errors import Conflict
from aamp.runs.bus import APPROVAL, EventBus
from aamp.runs.leases import RunLeases
from aamp.runs.store import RunEvent, RunStore
from aamp.runs.waiting import LiveRun
from aamp.store import Store


class ApprovalRefused(Exception):
    """An approval was denied or timed out; the message is the run's failure reason."""


class RunApprovals:
    """Approvals: a question put, its answer awaited, the run paused meanwhile."""

    store: Store
    runs: RunStore
    bus: EventBus
    leases: RunLeases
    lease_seconds: float
    _live: dict[str, LiveRun]
    emit: Callable[[str, str, dict[str, Any]], Awaitable[RunEvent]]  # the service's: a step

    async def decide(self, approval_id: str, approve: bool, *, by: str, note: str | None) -> dict:
        """Answer an approval in its row; the run waiting on it, on whichever replica, wakes
        and records `approval.decided` (its driver writes its steps)."""
        status = "approved" if approve else "denied"
        decided = await self.store.run(lambda: self.runs.decide(approval_id, status, by, note))
        self.bus.notify(approval_id, APPROVAL)
        return decided

    async def _answer(self, approval_id: str, timeout: int) -> Answer:
        """Wait for the answer in the approval's row — woken when it is answered, on any
        replica, and reading it again every lease beat anyway — or expire it after
        `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            waiter = self.bus.waiter(approval_id, APPROVAL)  # before the read: see bus.py
            row = await self.store.run(self.runs.get_approval, approval_id)
            if row["status"] != "pending":
                return Answer(row["status"], row["decided_by"] or "nobody", row["note"])
            left = deadline - loop.time()
            if left <= 0:
                try:
                    await self.store.run(lambda: self.runs.decide(approval_id, "expired", "system"))
                except Conflict:
                    continue  # answered just now: read that answer
                return Answer("expired", "nobody")
            await self.bus.wait(waiter, min(left, self.lease_seconds / 3))

    async def _question(
        self, run_id: str, kind: str, subject: dict[str, Any], timeout: int
    ) -> tuple[str, Answer]:
        """Put one question to the people who may answer it and pause the run until the
        answer (approved, denied, or expired after `timeout` seconds); returns its id and
        the answer."""
        live = self._live.get(run_id)
        if live is not None:
            live.begin_wait()
        try:
            asked = await self.store.run(
                lambda: self.runs.request_approval(run_id, kind, subject, self.leases.fence(run_id))
            )
            approval_id = asked["id"]
            await self.emit(
                run_id,
                "approval.requested",
                {"approval": approval_id, "kind": kind, "subject": subject, "timeout": timeout},
            )
            answer = await self._answer(approval_id, timeout)
            decided: dict[str, Any] = {"approval": approval_id, "status": answer.status}
            if answer.status != "expired":
                decided |= {"by": answer.by, "note": answer.note}
            await self.emit(run_id, "approval.decided", decided)
        finally:
            if live is not None:
                live.end_wait()
        if live is not None:
            await self._show_waiting(run_id, live)
        return approval_id, answer

    async def _show_waiting(self, run_id: str, live: LiveRun) -> None:
        """After a question closed: the run's status says whether it still waits for a person
        — judged when the write runs, so questions opening and closing at once leave the right
        one (opening one marks the run waiting in the same transaction)."""

        def write() -> None:
            status = "waiting_approval" if live.waiting else "running"
            with contextlib.suppress(Conflict):
                self.runs.update(run_id, self.leases.fence(run_id), status=status)

        await self.store.run(write)

    async def _ask(self, run_id: str, kind: str, subject: dict[str, Any], timeout: int) -> None:
        """Pause the run until a person answers; raises `ApprovalRefused` unless approved."""
        approval_id, answer = await self._question(run_id, kind, subject, timeout)
        if answer.status == "expired":
            raise ApprovalRefused(
                f"approval_timeout: nobody answered approval {approval_id} ({kind}) "
                f"within {timeout} s"
            )
        if answer.status != "approved":
            raise ApprovalRefused(f"{kind}: {answer.by} denied approval {approval_id}")

    def _egress_approver(self, run_id: str, timeout: int) -> Approver:
        """Answers the run's sandbox's `default: ask` destinations by asking a person. A
        denial or no answer refuses the connection (the agent sees why); the run goes on."""

        async def approve(host: str, port: int) -> Answer:
            live = self._live.get(run_id)
            task = asyncio.current_task()
            if live is not None and task is not None:
                live.questions.append((f"{host}:{port}", task))
            subject = {"host": host, "port": port}
            _, answer = await self._question(run_id, "egress", subject, timeout)
            return answer

        return approve
