"""One replica among others: this replica's leases kept, the runs whose lease expired taken
over (going on from their step log, or failed saying why), and what other replicas asked of
the runs driven here — a cancel written in a run's row, a sandbox lost with its host.

`Replica` is a part of `RunService` (`service.py`), moved here unchanged: its methods use the
service's store, runs, leases and the runs it drives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aamp.agents.loop_replay import LoopState, NotResumable, replay
from aamp.errors import AampError, Conflict
from aamp.runs.bus import Listener
from aamp.runs.leases import LeaseLost, RunLeases
from aamp.runs.store import RunEvent, RunInfo, RunStore
from aamp.store import Store
from aamp.store.timestamps import parse_time

if TYPE_CHECKING:
    from aamp.runs.service import RunRequest

log = logging.getLogger("aamp.runs")


STOPPED = "the control plane stopped during the run (killed or crashed)"
SHUT_DOWN = "the control plane shut down during the run"
HANDED_OFF = "run.handed_off"  # the last step of a run whose replica shut down cleanly
FRESH_SANDBOX_NOTE = (
    "[aamp] The control-plane process that ran the steps above stopped; this run goes on in a "
    "fresh sandbox. /workspace holds the input files again; files written by the tool calls "
    "above are gone, so write again anything you still need."
)


@dataclass(frozen=True)
class Takeover:
    """A run this replica took over: where its loop stood, and whose lease expired."""

    previous: str | None  # the replica that drove it (None: it never took a lease)
    state: LoopState
    after_seq: int  # the run's last stored step
    elapsed: float  # wall-clock seconds the run had run until that step
    kb_versions: dict[str, int]  # the knowledge-base versions it had mounted


class Replica:
    """Leases, takeovers, and cancels or lost sandboxes seen in the rows."""

    store: Store
    runs: RunStore
    leases: RunLeases
    lease_seconds: float
    replica: str
    listener: Listener | None
    rebuild: Callable[[RunInfo], Awaitable[RunRequest]] | None
    sandbox_losses: Callable[[set[str]], dict[str, str]] | None
    _keeper: asyncio.Task[None] | None
    _sweep_soon: asyncio.Event
    _tasks: dict[str, asyncio.Task[None]]
    _cancel_reasons: dict[str, tuple[str, str]]
    _fenced_out: set[str]
    _checks: set[asyncio.Task[None]]
    _sandboxes: dict[str, str]
    emit: Callable[[str, str, dict[str, Any]], Awaitable[RunEvent]]  # the service's: a step
    _start: Callable[[RunRequest, Takeover | None], None]

    async def recover(self) -> list[str]:
        """Start this replica's lease task; on SQLite first take over every unfinished run
        (the installation lock makes each a dead process's: its sandbox was reaped at
        start-up). Returns the ids taken over now."""
        taken = []
        if self.listener is not None:
            self.listener.start()
        if self.store.dialect == "sqlite":
            while (
                claim := await self.store.run(lambda: self.leases.claim_expired(any_age=True))
            ) is not None:
                await self._take_over(*claim)
                taken.append(claim[0])
        if self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(
                self._keep_leases(), name=f"run-leases-{self.replica}"
            )
        return taken

    async def _keep_leases(self) -> None:
        """Every third of a lease: renew this replica's leases (dropping the runs another
        replica took over meanwhile), then take over the runs whose lease expired."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sweep_soon.wait(), self.lease_seconds / 3)
            self._sweep_soon.clear()
            try:
                await self.sweep_leases()
            except Exception:  # the store is down: try again at the next beat
                log.exception("renewing run leases failed")

    async def sweep_leases(self) -> list[str]:
        """One beat of `_keep_leases`; returns the runs taken over."""
        lost = await self.store.run(self.leases.renew, self.leases.held())
        for run_id in lost:
            task = self._tasks.get(run_id)
            if task is not None and not task.done():
                log.warning("run %s was taken over by another replica; stopping it here", run_id)
                self._fenced_out.add(run_id)
                task.cancel()
        # The poll behind the cancel wake-ups: a notification missed only delays a cancel.
        await self._cancel_asked_here(self.leases.held())
        await self.fail_lost_sandboxes()
        taken = []
        while (claim := await self.store.run(self.leases.claim_expired)) is not None:
            await self._take_over(*claim)
            taken.append(claim[0])
        return taken

    async def fail_lost_sandboxes(self) -> list[str]:
        """Fail, with the reason, every run here whose sandbox was lost with its host;
        returns their ids."""
        if self.sandbox_losses is None or not self._sandboxes:
            return []
        lost = await self.store.run(self.sandbox_losses, set(self._sandboxes.values()))
        failed = []
        for run_id, sandbox_id in list(self._sandboxes.items()):
            task = self._tasks.get(run_id)
            if sandbox_id in lost and task is not None and not task.done():
                why = f"sandbox: {sandbox_id} was lost: {lost[sandbox_id]}"
                self._cancel_reasons.setdefault(run_id, ("failed", why))
                task.cancel()
                failed.append(run_id)
        return failed

    def _cancel_asked(self, run_id: str | None) -> None:
        """A wake-up: someone asked to cancel `run_id` (None: maybe any run) on some replica."""
        ids = set(self._tasks) if run_id is None else {run_id} & set(self._tasks)
        if ids:
            task = asyncio.get_running_loop().create_task(self._cancel_asked_here(ids))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def _cancel_asked_here(self, run_ids: set[str]) -> None:
        """Cancel those of `run_ids` driven here that someone asked to cancel (their rows say
        so: the wake-up alone is not trusted)."""
        asked = await self.store.run(self.runs.cancel_requests, run_ids)
        for run_id, by in asked.items():
            task = self._tasks.get(run_id)
            if task is not None and not task.done():
                self._cancel_reasons.setdefault(run_id, ("cancelled", f"cancelled by {by}"))
                task.cancel()

    async def _take_over(self, run_id: str, previous: str | None) -> None:
        """Go on with a run whose driver stopped, from its step log, or fail it saying why."""
        who = f"replica {previous}" if previous else "a process that never took its lease"
        asked = await self.store.run(self.runs.cancel_requests, {run_id})
        if run_id in asked:
            await self._fail_taken(run_id, f"cancelled by {asked[run_id]}", status="cancelled")
            return
        try:
            run = await self.store.run(self.runs.get, run_id)
            events = await self.store.run(self.runs.events_after, run_id, 0, 1_000_000)
            if events and events[-1].type == HANDED_OFF:
                who, stopped = f"replica {previous}", SHUT_DOWN
            else:
                stopped = STOPPED
            state = replay((e.type, e.data) for e in events)
            if self.rebuild is None:
                raise NotResumable("this process cannot rebuild runs")
            request = await self.rebuild(run)
            mounted = {
                str(e.data.get("name")): int(e.data.get("version") or 0)
                for e in events
                if e.type == "knowledge_base.mounted"
            }
            for name, version in mounted.items():
                now_at = request.knowledge_bases.get(name, (None, None))[0]
                if now_at != version:
                    raise NotResumable(
                        f"knowledge base {name!r} is at version {now_at} now; "
                        f"the run searched version {version}"
                    )
        except (NotResumable, AampError) as exc:
            await self._fail_taken(run_id, f"{stopped} ({who}); it cannot go on: {exc}")
            return
        except Exception as exc:  # e.g. an ApiError from the rebuild: its message says why
            await self._fail_taken(
                run_id, f"{stopped} ({who}); it cannot go on: {getattr(exc, 'message', exc)}"
            )
            return
        if events and run.started_at:
            elapsed = (parse_time(events[-1].at) - parse_time(run.started_at)).total_seconds()
        else:
            elapsed = 0.0
        state.note = FRESH_SANDBOX_NOTE if state.steps else None
        after = events[-1].seq if events else 0
        takeover = Takeover(previous, state, after, max(0.0, elapsed), mounted)
        self._start(request, takeover)

    async def _fail_taken(self, run_id: str, reason: str, status: str = "failed") -> None:
        fence = self.leases.fence(run_id)
        try:
            await self.store.run(self.runs.cancel_pending, run_id)
            with contextlib.suppress(Conflict):
                await self.store.run(
                    lambda: self.runs.update(run_id, fence, status=status, reason=reason)
                )
            await self.emit(run_id, "run.finished", {"status": status, "reason": reason})
            await self.store.run(self.runs.forget_inputs, run_id)
        except LeaseLost:
            pass  # another replica took it from this one meanwhile: it is theirs to end
        finally:
            await self.store.run(self.leases.release, run_id)
