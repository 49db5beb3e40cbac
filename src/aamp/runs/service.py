"""`RunService`: runs an agent version on a task in a fresh sandbox, from queued to its end.

One asyncio task per run. Its life: queued → running (sandbox made from the agent's policy,
inputs copied into /workspace/in) → the loop (`aamp.agents.loop`) under the wall-time limit →
artifacts from /workspace/out (checked against `data.outbound`; above its `approval` size
each waits for a person, under the separate approval timeout, during which the run is
`waiting_approval`) → succeeded | failed | cancelled | timed_out. Whatever the ending, the
sandbox is destroyed, pending approvals are closed, and a final `run.finished` step is stored.
With `egress.default: ask` the sandbox's proxy asks the same people about destinations outside
the rules (`_egress_approver`); the run pauses, its wall clock stopped (`aamp.runs.waiting`).

Steps go through `aamp.runs.steps.StepLog` (stored, audited, announced). Its parts, each a
module of its own: the questions put to people (`approvals.py`), this replica among others
— leases, takeovers, cancels and lost sandboxes (`replica.py`) — and a run's files in its
sandbox (`run_files.py`).

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
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aamp.agents import DocumentsTool, RagTool, rag_index_path
from aamp.agents.browser_tool import BrowserTool
from aamp.agents.definition import AgentDefinition
from aamp.agents.loop import run_loop, summarise
from aamp.agents.model import EndpointAccess, ModelClient, ModelError
from aamp.agents.sandbox_tools import SandboxTools
from aamp.agents.tools import ToolSet
from aamp.audit.record import AuditSink
from aamp.catalog.model_endpoints import ModelEndpoint
from aamp.config import Settings
from aamp.egress.recent import EgressView
from aamp.egress.registered import AddressVerdict, CheckedTransport
from aamp.errors import Conflict
from aamp.policy import Policy
from aamp.runs.approvals import ApprovalRefused, RunApprovals
from aamp.runs.bus import CANCEL, LEASE, EventBus, Listener
from aamp.runs.leases import DEFAULT_LEASE_SECONDS, LeaseLost, RunLeases
from aamp.runs.replica import HANDED_OFF, SHUT_DOWN, Replica, Takeover
from aamp.runs.run_files import RunFiles
from aamp.runs.steps import StepLog
from aamp.runs.store import RunEvent, RunInfo, RunStore
from aamp.runs.waiting import ApprovalGate, LiveRun
from aamp.sandbox import ChannelError, ReadOnlyFile
from aamp.sandbox.manager import CreateRequest, SandboxError, SandboxManager, UnknownSandbox
from aamp.store import Store
from aamp.store.timestamps import now
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


CANCEL_WAIT_SECONDS = 30.0  # beyond two leases, for a cancel asked of another replica


@dataclass(eq=False, repr=False)
class RunService(RunApprovals, Replica, RunFiles):
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
            # Only an `ask` policy's destinations are put to people; any other has no question
            # to answer (so a sandbox on another replica's own host, which cannot send its
            # questions on, runs it too).
            if req.policy.egress.default == "ask":
                await self.manager.set_egress_approver(
                    sandbox_id, self._egress_approver(run_id, asking), timeout=asking
                )
            borrow = lambda: self.manager.use(sandbox_id)  # type: ignore[arg-type]  # noqa: E731
            rag = RagTool(borrow, d.limits.tool_timeout_seconds, tuple(req.knowledge_bases))
            egress = await self._egress_view(sandbox_id, {"browser", "documents"} & set(d.tools))
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
                        egress if "browser" in d.tools else None,
                    ),
                    documents=DocumentsTool(
                        borrow,
                        d.limits.tool_timeout_seconds,
                        egress if "documents" in d.tools else None,
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

    async def _egress_view(self, sandbox_id: str, tools: set[str]) -> EgressView | None:
        """The sandbox's egress view for the tools that explain refusals (wherever its host
        is: one on another host is its host's view, over the link)."""
        if not tools:
            return None
        return await self.manager.egress_view(sandbox_id)

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
