"""`RunService`: runs an agent version on a task in a fresh sandbox, from queued to its end.

One asyncio task per run. Its life: queued → running (sandbox made from the agent's policy,
inputs copied into /workspace/in) → the loop (`aamp.agents.loop`) under the wall-time limit →
artifacts from /workspace/out (checked against `data.outbound`; above its `approval` size
each waits for a person, under the separate approval timeout, during which the run is
`waiting_approval`) → succeeded | failed | cancelled | timed_out. Whatever the ending, the
sandbox is destroyed, pending approvals are closed, and a final `run.finished` step is stored.
With `egress.default: ask` the sandbox's proxy asks the same people about destinations outside
the rules (`_egress_approver`); the run pauses, its wall clock stopped (`aamp.runs.waiting`).

Steps go through `aamp.runs.steps.StepLog` (stored, audited, announced).

Leases (`aamp.runs.leases`): this process is one replica (`replica`, a fresh id per start).
It takes the lease of each run it starts, renews every lease it holds every third of
`lease_seconds` (`_keep_leases`), and writes a run's steps and status only under that lease
(a write after another replica took the run over is refused, `LeaseLost`, and the run is
dropped here without another write). The same task takes over runs whose lease expired — a
replica that died — and each such run goes on from its step log (`aamp.agents.loop_replay`):
in a fresh sandbox, the inputs put again, the model told that files written before are gone,
numbering on from the last stored step; or it fails with the reason when it cannot go on
(it stopped inside a tool call, which is never repeated; its model had already answered; its
agent can no longer use what it needs). On SQLite one process alone uses the store (the
installation lock), so at start-up (`recover()`) every unfinished run is taken over at once,
through the same path.

Any replica serves a run's requests (`aamp.runs.bus` wakes the others through the rows):
a cancel asked for on a replica that does not drive the run is written into the run's row
(`cancel_requested_by`) and the driver, woken by it or at its next lease beat, cancels the
run (a replica taking over a run someone asked to cancel ends it cancelled); an approval is
answered in its row and the driver, waiting on that row, goes on. A clean shutdown on
PostgreSQL hands each live run's lease over (`run.handed_off`, the lease expired at once,
the other replicas woken) instead of failing the run; on SQLite, where no other replica can
take it, it fails the run as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import posixpath
import secrets
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aamp.agents import DocumentsTool, RagTool, guest_scripts, rag_index_path
from aamp.agents.browser_tool import BrowserTool
from aamp.agents.definition import AgentDefinition
from aamp.agents.loop import run_loop, summarise
from aamp.agents.loop_replay import LoopState, NotResumable, replay
from aamp.agents.model import EndpointAccess, ModelClient, ModelError
from aamp.agents.sandbox_tools import SandboxTools
from aamp.agents.tools import ToolSet
from aamp.audit.record import AuditSink
from aamp.catalog.model_endpoints import ModelEndpoint
from aamp.config import Settings
from aamp.egress.approvals import Answer, Approver
from aamp.egress.registered import AddressVerdict, CheckedTransport
from aamp.errors import AampError, Conflict, NotFound
from aamp.policy import Policy
from aamp.runs import artifacts as art
from aamp.runs.bus import APPROVAL, CANCEL, LEASE, EventBus, Listener
from aamp.runs.leases import DEFAULT_LEASE_SECONDS, LeaseLost, RunLeases
from aamp.runs.steps import StepLog
from aamp.runs.store import RunEvent, RunInfo, RunStore
from aamp.runs.waiting import ApprovalGate, LiveRun
from aamp.sandbox import ChannelError, ReadOnlyFile
from aamp.sandbox.manager import CreateRequest, SandboxError, SandboxManager, UnknownSandbox
from aamp.store import Store
from aamp.store.timestamps import now, parse_time
from aamp.vault import SecretNotFound, Vault

log = logging.getLogger("aamp.runs")


@dataclass(frozen=True)
class RunRequest:
    """Everything a run needs, resolved and authorised by the API before it is queued."""

    run: RunInfo
    definition: AgentDefinition
    policy: Policy
    create: CreateRequest
    inputs: tuple[tuple[str, bytes], ...]
    services: dict[str, str]  # service tool name -> the upstream URL the guest calls
    actor: str
    endpoint: ModelEndpoint  # the agent's model endpoint, granted and confirmed
    # Each granted knowledge base the agent searches -> (version, index file): the one
    # version the whole run uses.
    knowledge_bases: dict[str, tuple[int, Path]] = field(default_factory=dict)


class ApprovalRefused(Exception):
    """An approval was denied or timed out; the message is the run's failure reason."""


def artifacts_dir(settings: Settings, run_id: str) -> Path:
    return settings.home / "artifacts" / run_id


STOPPED = "the control plane stopped during the run (killed or crashed)"
SHUT_DOWN = "the control plane shut down during the run"
HANDED_OFF = "run.handed_off"  # the last step of a run whose replica shut down cleanly
CANCEL_WAIT_SECONDS = 30.0  # beyond two leases, for a cancel asked of another replica
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


@dataclass(eq=False, repr=False)
class RunService:
    settings: Settings
    store: Store
    audit: AuditSink
    manager: SandboxManager
    vault: Vault | None
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    # Rebuilds what a run taken over needs from its row (the agent version, policy, grants,
    # inputs), as the API resolved it for a new run; set by `aamp.server`. None: a run
    # taken over fails, since nothing here can resolve it.
    rebuild: Callable[[RunInfo], Awaitable[RunRequest]] | None = None
    # (Blocking.) Of some sandboxes, those lost with their host and why (`FleetPlacer.lost`);
    # set by `aamp.server`.
    sandbox_losses: Callable[[set[str]], dict[str, str]] | None = None

    def __post_init__(self) -> None:
        self.runs = RunStore(self.store)
        self.bus = EventBus()
        self.replica = f"replica-{secrets.token_hex(6)}"
        self.leases = RunLeases(self.store, self.replica, seconds=self.lease_seconds)
        self.steps = StepLog(self.store, self.runs, self.audit, self.bus, self.leases.fence)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel_reasons: dict[str, tuple[str, str]] = {}
        self._live: dict[str, LiveRun] = {}
        self._fenced_out: set[str] = set()  # runs another replica took over from this one
        self._handed_off: set[str] = set()  # runs this replica gives up as it shuts down
        # Wake-ups from the other replicas (PostgreSQL); SQLite has this process only.
        self.listener = Listener(self.store, self.bus) if self.store.dialect != "sqlite" else None
        self._sweep_soon = asyncio.Event()  # a lease was given up: claim it now
        self._checks: set[asyncio.Task[None]] = set()
        self.bus.subscribe(CANCEL, self._cancel_asked)
        self.bus.subscribe(LEASE, lambda _run_id: self._sweep_soon.set())
        self._sandboxes: dict[str, str] = {}  # run id -> its sandbox, while it lives
        self._keeper: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

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

    async def shutdown(self) -> None:
        """Stop every live run and wait for its end here. On PostgreSQL each is handed to
        another replica (its lease given up, expired at once, the replicas woken), which goes
        on from its step log or fails it saying why; on SQLite, where no other replica can
        take it, it fails (the control plane shut down)."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keeper
            self._keeper = None
        hand_off = self.store.dialect != "sqlite"
        for run_id, task in list(self._tasks.items()):
            if hand_off:
                self._handed_off.add(run_id)
            else:
                self._cancel_reasons.setdefault(run_id, ("failed", SHUT_DOWN))
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for check in list(self._checks):
            check.cancel()
        if self.listener is not None:
            await self.listener.stop()

    def start(self, request: RunRequest) -> None:
        self._start(request, None)

    def _start(self, request: RunRequest, takeover: Takeover | None) -> None:
        run_id = request.run.id
        self._live[run_id] = LiveRun()
        self._tasks[run_id] = asyncio.get_running_loop().create_task(
            self._execute(request, takeover), name=f"run-{run_id}"
        )

    def live(self, run_id: str) -> bool:
        task = self._tasks.get(run_id)
        return task is not None and not task.done()

    async def cancel(self, run_id: str, *, by: str) -> bool:
        """Cancel an unfinished run, and wait (a bounded time) for its end: True once it
        ended. Driven here, it is cancelled at once; else the run's row asks its driver,
        whichever replica that is (or the one that takes it over) — `Conflict` if it ended."""
        task = self._tasks.get(run_id)
        if task is not None and not task.done():
            self._cancel_reasons.setdefault(run_id, ("cancelled", f"cancelled by {by}"))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(task)
            return True
        await self.store.run(self.runs.request_cancel, run_id, by)
        self._sweep_soon.set()  # a run whose driver died is claimed, and ended, here
        loop = asyncio.get_running_loop()
        # Long enough for a dead driver's lease to expire and the taker to end the run, and
        # for a live one to destroy the sandbox (as a cancel here waits for, unbounded).
        deadline = loop.time() + 2 * self.lease_seconds + CANCEL_WAIT_SECONDS
        while loop.time() < deadline:
            waiter = self.bus.waiter(run_id)  # its steps: run.finished among them
            if await self.store.run(self.runs.settled, run_id):
                return True
            await self.bus.wait(waiter, min(1.0, max(0.0, deadline - loop.time())))
        return False

    async def wait(self, run_id: str) -> None:
        task = self._tasks.get(run_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    # -- steps -------------------------------------------------------------------------------

    async def emit(self, run_id: str, type_: str, data: dict[str, Any]) -> RunEvent:
        return await self.steps.emit(run_id, type_, data)

    # -- approvals ---------------------------------------------------------------------------

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

    # -- one run -----------------------------------------------------------------------------

    async def _execute(self, req: RunRequest, takeover: Takeover | None = None) -> None:
        run_id, d = req.run.id, req.definition
        sandbox_id: str | None = None
        status, reason, answer = "failed", "the run ended without an outcome", None
        summary: dict[str, Any] = {}
        try:
            if takeover is None:
                await self.store.run(self.leases.take, run_id)
            fence = self.leases.fence(run_id)
            started = {"started_at": now()} if takeover is None else {}
            await self.store.run(
                lambda: self.runs.update(run_id, fence, status="running", **started)
            )
            if takeover is None:
                await self.emit(
                    run_id, "run.started", {"version": req.run.version, "policy": d.policy}
                )
            else:
                await self.emit(
                    run_id,
                    "run.resumed",
                    {
                        "by": self.replica,
                        "from": takeover.previous,
                        "after_seq": takeover.after_seq,
                        "model_steps": takeover.state.steps,
                        "workspace": "fresh",
                    },
                )
            mounting = self.manager.can_mount_files(req.create.driver)
            create = req.create
            if mounting and req.knowledge_bases:
                mounts = tuple(ReadOnlyFile(path, rag_index_path(name))
                               for name, (_, path) in req.knowledge_bases.items())  # fmt: skip
                create = replace(create, read_only_files=mounts)
            sandbox = await self.manager.create(create, actor=f"run:{run_id}")
            sandbox_id = sandbox.id
            self._sandboxes[run_id] = sandbox_id
            await self.store.run(lambda: self.runs.update(run_id, fence, sandbox_id=sandbox_id))
            await self.emit(
                run_id,
                "sandbox.created",
                {
                    "sandbox": sandbox_id,
                    "image": sandbox.image,
                    "driver": sandbox.driver,
                    "warm": sandbox.warm,
                },
            )
            await self._put_inputs(run_id, sandbox_id, req.inputs)
            await self._give_indexes(run_id, sandbox_id, req.knowledge_bases, mounting)
            model = ModelClient(d.model, self._endpoint_access(run_id, req.endpoint))
            tools = ToolSet.build(d.tools, {n: u for n, u in req.services.items()})
            live = self._live[run_id]
            asking = d.limits.approval_timeout_seconds
            self.manager.set_egress_approver(sandbox_id, self._egress_approver(run_id, asking))
            borrow = lambda: self.manager.use(sandbox_id)  # type: ignore[arg-type]  # noqa: E731
            rag = RagTool(borrow, d.limits.tool_timeout_seconds, tuple(req.knowledge_bases))
            if req.knowledge_bases:  # its model loads while the first model call is made
                await rag.start()
            executor = ApprovalGate(
                SandboxTools(
                    borrow,
                    {f"service_{n.replace('-', '_')}": u for n, u in req.services.items()},
                    d.limits.tool_timeout_seconds,
                    browser=BrowserTool(
                        borrow,
                        d.limits.tool_timeout_seconds,
                        d.browser,
                        self.manager.egress_view(sandbox_id) if "browser" in d.tools else None,
                    ),
                    documents=DocumentsTool(
                        borrow,
                        d.limits.tool_timeout_seconds,
                        self.manager.egress_view(sandbox_id) if "documents" in d.tools else None,
                    ),
                    rag=rag,
                ),
                live,
                asking,
            )

            async def emit(type_: str, data: dict[str, Any]) -> None:
                await self.emit(run_id, type_, data)

            # A run taken over has spent the time up to its last stored step already.
            spent = takeover.elapsed if takeover is not None else 0.0
            wall = asyncio.timeout(max(0.0, d.limits.wall_time_seconds - spent))
            try:
                async with wall:
                    live.wall = wall  # stopped while the run waits for a person
                    try:
                        inputs = [n for n, _ in req.inputs]
                        outcome = await run_loop(
                            d,
                            req.run.task,
                            inputs,
                            model,
                            tools,
                            executor,
                            emit,
                            takeover.state if takeover is not None else None,
                        )
                    finally:
                        live.wall = None
            except TimeoutError:
                if not wall.expired():
                    raise
                status = "timed_out"
                reason = f"wall_time: the run took longer than {d.limits.wall_time_seconds} s"
                return
            finally:
                await model.close()
            summary = summarise(outcome)
            status, reason, answer = outcome.status, outcome.reason, outcome.answer
            if status == "succeeded":
                refused = await self._collect(run_id, sandbox_id, req)
                if refused:
                    reason = "artifacts refused: " + "; ".join(refused)
        except asyncio.CancelledError:
            status, reason = self._cancel_reasons.get(run_id, ("cancelled", "cancelled"))
        except LeaseLost:
            self._fenced_out.add(run_id)  # another replica drives it now: write nothing more
        except ModelError as exc:
            status, reason = "failed", f"model: {exc}"
        except ApprovalRefused as exc:
            status, reason = "failed", str(exc)
        except (SandboxError, ChannelError) as exc:
            status, reason = "failed", f"sandbox: {exc}"
        except Exception as exc:  # a bug must still end the run cleanly
            log.exception("run %s failed", run_id)
            status, reason = "failed", f"internal error: {type(exc).__name__}: {exc}"
        finally:
            await self._finish(run_id, sandbox_id, status, reason, answer, summary)

    async def _finish(
        self,
        run_id: str,
        sandbox_id: str | None,
        status: str,
        reason: str | None,
        answer: str | None,
        summary: dict[str, Any],
    ) -> None:
        fence = self.leases.fence(run_id)
        try:
            if sandbox_id is not None:
                with contextlib.suppress(UnknownSandbox):
                    await self.manager.destroy(
                        sandbox_id, reason=f"run {run_id} ended", actor=f"run:{run_id}"
                    )
            if run_id in self._fenced_out:
                return  # taken over: its ending is the new driver's to write
            if run_id in self._handed_off:  # this replica shuts down: another goes on
                await self.emit(run_id, HANDED_OFF, {"by": self.replica, "reason": SHUT_DOWN})
                return
            await self.store.run(self.runs.cancel_pending, run_id)
            with contextlib.suppress(Conflict):
                await self.store.run(
                    lambda: self.runs.update(
                        run_id, fence, status=status, reason=reason, answer=answer
                    )
                )
            await self.emit(
                run_id,
                "run.finished",
                {"status": status, "reason": reason, "answer": answer, "timing": summary},
            )
            await self.store.run(self.runs.forget_inputs, run_id)
        except LeaseLost:
            log.warning("run %s was taken over by another replica before it ended here", run_id)
        finally:
            self._tasks.pop(run_id, None)
            self._live.pop(run_id, None)
            self._cancel_reasons.pop(run_id, None)
            self._fenced_out.discard(run_id)
            self._sandboxes.pop(run_id, None)
            handed_off = run_id in self._handed_off
            self._handed_off.discard(run_id)
            with contextlib.suppress(Exception):  # an expired lease is claimed anyway
                give_up = self.leases.hand_off if handed_off else self.leases.release
                await self.store.run(give_up, run_id)

    def _endpoint_access(self, run_id: str, endpoint: ModelEndpoint) -> EndpointAccess:
        """The run's way to its model endpoint: every connection resolved once with the
        installation's resolver, address-checked and audited (`model.connect`); the API key
        revealed from the vault for each model call (audited there, name and version)."""
        actor = f"run:{run_id}"
        owner = f"model endpoint {endpoint.name}"

        async def on_connect(verdicts: list[AddressVerdict], used: AddressVerdict | None) -> None:
            refused = next((v for v in verdicts if not v.allowed), None)
            await self.audit.record(
                actor=actor,
                action="model.connect",
                resource=f"model-endpoint:{endpoint.name}",
                decision="allow" if used is not None else "deny",
                reason=(used or refused or verdicts[0]).reason,
                details={
                    "url": endpoint.base_url,
                    "address": str(used.address) if used else None,
                    "addresses": [
                        {"address": str(v.address), "class": v.kind.value, "allowed": v.allowed}
                        for v in verdicts
                    ],
                },
            )

        transport = CheckedTransport(
            owner, endpoint.url, self.manager.resolver, on_connect=on_connect
        )
        secret = endpoint.api_key_secret
        if secret is None:
            return EndpointAccess(endpoint.name, endpoint.base_url, transport)
        vault = self.vault

        async def api_key() -> str:
            if vault is None:
                raise ModelError(f"{owner} needs secret {secret!r}, and there is no vault")
            try:
                value = await vault.reveal(
                    secret,
                    purpose=f"model API key for {run_id} ({owner}, {endpoint.base_url})",
                    actor=actor,
                )
            except SecretNotFound:
                raise ModelError(
                    f"{owner} names secret {secret!r}, which the vault does not hold"
                ) from None
            return value.expose()

        return EndpointAccess(endpoint.name, endpoint.base_url, transport, api_key)

    async def _put_inputs(
        self, run_id: str, sandbox_id: str, inputs: tuple[tuple[str, bytes], ...]
    ) -> None:
        async with self.manager.use(sandbox_id) as channel:
            await channel.run(["mkdir", "-p", "/workspace/in", "/workspace/out"], timeout=30)
            for name, data in inputs:
                path = posixpath.join("/workspace/in", name)
                await channel.put(path, data, len(data))
                await self.emit(
                    run_id,
                    "file.in",
                    {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
                )

    async def _give_indexes(
        self, run_id: str, sandbox_id: str, indexes: dict[str, tuple[int, Path]], mounted: bool
    ) -> None:
        """Say how each knowledge base's index is in the sandbox, where only the worker reads
        it: mounted read-only at boot (gVisor: the stored file itself, which the guest cannot
        change), or — a driver that cannot mount files (Firecracker) — copied in now, into
        the guest's own disk, where the guest could change its copy but never the stored
        file; the event says which."""
        for name, (version, path) in indexes.items():
            about = {"name": name, "version": version, "index": path.stem}
            if mounted:
                about |= {"size": path.stat().st_size, "read_only": True}
                await self.emit(run_id, "knowledge_base.mounted", about)
                continue
            async with self.manager.use(sandbox_id) as channel:
                size = await channel.put_file(rag_index_path(name), path)
            reason = "this sandbox's driver cannot mount host files read-only"
            await self.emit(run_id, "knowledge_base.copied", about | {"size": size,
                            "read_only": False, "reason": reason})  # fmt: skip

    async def _collect(self, run_id: str, sandbox_id: str, req: RunRequest) -> list[str]:
        """Copy /workspace/out's files out as artifacts; returns the refusals' reasons."""
        rule = req.policy.data.outbound
        async with self.manager.use(sandbox_id) as channel:
            result, out, _ = await channel.run(
                ["python3", "-c", guest_scripts.LIST, *art.ROOTS], timeout=60
            )
        answer = guest_scripts.answer(out) if result.exit_code == 0 else None
        found, clashes = art.candidates(answer.get("entries") if answer else None)
        refused: list[str] = []
        for clash, reason in clashes:
            refused.append(reason)
            await self.emit(run_id, "artifact.refused", {"name": clash.name, "reason": reason})
        used = 0
        kept: set[str] = set()  # content hashes of registered artifacts
        dest = artifacts_dir(self.settings, run_id)
        for candidate in found:
            try:
                art.check(candidate, rule, used)
                async with self.manager.use(sandbox_id) as channel:
                    path, size, sha = await art.copy_out(
                        channel, candidate, dest, rule.max_bytes - used
                    )
            except art.ArtifactRefused as exc:
                refused.append(str(exc))
                await self.emit(
                    run_id, "artifact.refused", {"name": candidate.name, "reason": str(exc)}
                )
                continue
            subject = {"name": candidate.name, "size": size, "sha256": sha}
            if rule.needs_approval(used + size):
                timeout = req.definition.limits.approval_timeout_seconds
                try:
                    await self._ask(run_id, "data.outbound", subject, timeout)
                except BaseException:
                    if sha not in kept:  # data nobody approved does not stay on the host
                        path.unlink(missing_ok=True)
                    raise
            kept.add(sha)
            used += size
            await self.store.run(
                self.runs.add_artifact, run_id, candidate.name, size, sha, self.leases.fence(run_id)
            )
            await self.emit(run_id, "artifact", subject)
        return refused

    def artifact_path(self, run_id: str, name: str) -> tuple[Path, dict[str, Any]]:
        for item in self.runs.artifacts(run_id):
            if item["name"] == name:
                return artifacts_dir(self.settings, run_id) / item["sha256"], item
        raise NotFound(f"run {run_id} has no artifact {name!r}")

    def forget_artifacts(self, run_id: str) -> None:
        shutil.rmtree(artifacts_dir(self.settings, run_id), ignore_errors=True)
