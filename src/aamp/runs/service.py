"""`RunService`: runs an agent version on a task in a fresh sandbox, from queued to its end.

One asyncio task per run. Its life: queued → running (sandbox made from the agent's policy,
inputs copied into /workspace/in) → the loop (`aamp.agents.loop`) under the wall-time limit →
artifacts from /workspace/out (checked against `data.outbound`; above its `approval` size
each waits for a person, under the separate approval timeout, during which the run is
`waiting_approval`) → succeeded | failed | cancelled | timed_out. Whatever the ending, the
sandbox is destroyed, pending approvals are closed, and a final `run.finished` step is stored.
With `egress.default: ask` the sandbox's proxy asks the same people about destinations outside
the rules (`_egress_approver`); the run pauses, its wall clock stopped (`aamp.runs.waiting`).

Steps go through `aamp.runs.steps.StepLog` (stored, audited, announced). At start-up
`recover()` ends, as failed with the reason, every run an earlier process left unfinished
(its sandbox was reaped by the sandbox manager).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import posixpath
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aamp.agents import DocumentsTool, RagTool, guest_scripts, rag_index_path
from aamp.agents.browser_tool import BrowserTool
from aamp.agents.definition import AgentDefinition
from aamp.agents.loop import run_loop, summarise
from aamp.agents.model import EndpointAccess, ModelClient, ModelError
from aamp.agents.sandbox_tools import SandboxTools
from aamp.agents.tools import ToolSet
from aamp.audit.record import AuditSink
from aamp.catalog.model_endpoints import ModelEndpoint
from aamp.config import Settings
from aamp.egress.approvals import Answer, Approver
from aamp.egress.registered import AddressVerdict, CheckedTransport
from aamp.errors import Conflict, NotFound
from aamp.policy import Policy
from aamp.runs import artifacts as art
from aamp.runs.bus import EventBus
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


class ApprovalRefused(Exception):
    """An approval was denied or timed out; the message is the run's failure reason."""


def artifacts_dir(settings: Settings, run_id: str) -> Path:
    return settings.home / "artifacts" / run_id


@dataclass(eq=False, repr=False)
class RunService:
    settings: Settings
    store: Store
    audit: AuditSink
    manager: SandboxManager
    vault: Vault | None

    def __post_init__(self) -> None:
        self.runs = RunStore(self.store)
        self.bus = EventBus()
        self.steps = StepLog(self.store, self.runs, self.audit, self.bus)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel_reasons: dict[str, tuple[str, str]] = {}
        self._approvals: dict[str, asyncio.Future[Answer]] = {}
        self._live: dict[str, LiveRun] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    async def recover(self) -> list[str]:
        """End every run an earlier process left unfinished; returns their ids."""
        ended = []
        for run in await self.store.run(self.runs.interrupted):
            reason = (
                "the control plane stopped during the run (killed or crashed); "
                "its sandbox was reaped at start-up"
            )
            await self.store.run(self.runs.cancel_pending, run.id)
            with contextlib.suppress(Conflict):
                await self.store.run(
                    lambda r=run, why=reason: self.runs.update(r.id, status="failed", reason=why)
                )
            await self.emit(run.id, "run.finished", {"status": "failed", "reason": reason})
            ended.append(run.id)
        return ended

    async def shutdown(self) -> None:
        """Stop every live run (failed: the control plane stopped) and wait for their ends."""
        for run_id, task in list(self._tasks.items()):
            self._cancel_reasons.setdefault(
                run_id, ("failed", "the control plane shut down during the run")
            )
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def start(self, request: RunRequest) -> None:
        run_id = request.run.id
        self._live[run_id] = LiveRun()
        self._tasks[run_id] = asyncio.get_running_loop().create_task(
            self._execute(request), name=f"run-{run_id}"
        )

    def live(self, run_id: str) -> bool:
        task = self._tasks.get(run_id)
        return task is not None and not task.done()

    async def cancel(self, run_id: str, *, by: str) -> bool:
        """Cancel a live run (True), or say it already ended (False)."""
        task = self._tasks.get(run_id)
        if task is None or task.done():
            return False
        self._cancel_reasons.setdefault(run_id, ("cancelled", f"cancelled by {by}"))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(task)
        return True

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
        status = "approved" if approve else "denied"
        decided = await self.store.run(lambda: self.runs.decide(approval_id, status, by, note))
        await self.emit(
            decided["run_id"],
            "approval.decided",
            {"approval": approval_id, "status": status, "by": by, "note": note},
        )
        future = self._approvals.get(approval_id)
        if future is not None and not future.done():
            future.set_result(Answer(status, by, note))
        return decided

    async def _question(
        self, run_id: str, kind: str, subject: dict[str, Any], timeout: int
    ) -> tuple[str, Answer]:
        """Put one question to the people who may answer it and pause the run until the
        answer (approved, denied, or expired after `timeout` seconds); returns its id and
        the answer."""
        live = self._live.get(run_id)
        if live is not None:
            live.begin_wait()
        asked: dict[str, Any] | None = None
        try:
            asked = await self.store.run(lambda: self.runs.request_approval(run_id, kind, subject))
            approval_id = asked["id"]
            future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
            self._approvals[approval_id] = future
            await self.emit(
                run_id,
                "approval.requested",
                {"approval": approval_id, "kind": kind, "subject": subject, "timeout": timeout},
            )
            try:
                answer = await asyncio.wait_for(future, timeout)
            except TimeoutError:
                with contextlib.suppress(Conflict):
                    await self.store.run(lambda: self.runs.decide(approval_id, "expired", "system"))
                await self.emit(
                    run_id, "approval.decided", {"approval": approval_id, "status": "expired"}
                )
                answer = Answer("expired", "nobody")
        finally:
            if asked is not None:
                self._approvals.pop(asked["id"], None)
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
                self.runs.update(run_id, status=status)

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

    async def _execute(self, req: RunRequest) -> None:
        run_id, d = req.run.id, req.definition
        sandbox_id: str | None = None
        status, reason, answer = "failed", "the run ended without an outcome", None
        summary: dict[str, Any] = {}
        try:
            await self.store.run(
                lambda: self.runs.update(run_id, status="running", started_at=now())
            )
            await self.emit(run_id, "run.started", {"version": req.run.version, "policy": d.policy})
            mounting = self.manager.can_mount_files(req.create.driver)
            create = req.create
            if mounting and req.knowledge_bases:
                mounts = tuple(ReadOnlyFile(path, rag_index_path(name))
                               for name, (_, path) in req.knowledge_bases.items())  # fmt: skip
                create = replace(create, read_only_files=mounts)
            sandbox = await self.manager.create(create, actor=f"run:{run_id}")
            sandbox_id = sandbox.id
            await self.store.run(lambda: self.runs.update(run_id, sandbox_id=sandbox_id))
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
                    rag=RagTool(borrow, d.limits.tool_timeout_seconds, tuple(req.knowledge_bases)),
                ),
                live,
                asking,
            )

            async def emit(type_: str, data: dict[str, Any]) -> None:
                await self.emit(run_id, type_, data)

            wall = asyncio.timeout(d.limits.wall_time_seconds)
            try:
                async with wall:
                    live.wall = wall  # stopped while the run waits for a person
                    try:
                        inputs = [n for n, _ in req.inputs]
                        outcome = await run_loop(
                            d, req.run.task, inputs, model, tools, executor, emit
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
        try:
            if sandbox_id is not None:
                with contextlib.suppress(UnknownSandbox):
                    await self.manager.destroy(
                        sandbox_id, reason=f"run {run_id} ended", actor=f"run:{run_id}"
                    )
            await self.store.run(self.runs.cancel_pending, run_id)
            with contextlib.suppress(Conflict):
                await self.store.run(
                    lambda: self.runs.update(run_id, status=status, reason=reason, answer=answer)
                )
            await self.emit(
                run_id,
                "run.finished",
                {"status": status, "reason": reason, "answer": answer, "timing": summary},
            )
        finally:
            self._tasks.pop(run_id, None)
            self._live.pop(run_id, None)
            self._cancel_reasons.pop(run_id, None)

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
            await self.store.run(self.runs.add_artifact, run_id, candidate.name, size, sha)
            await self.emit(run_id, "artifact", subject)
        return refused

    def artifact_path(self, run_id: str, name: str) -> tuple[Path, dict[str, Any]]:
        for item in self.runs.artifacts(run_id):
            if item["name"] == name:
                return artifacts_dir(self.settings, run_id) / item["sha256"], item
        raise NotFound(f"run {run_id} has no artifact {name!r}")

    def forget_artifacts(self, run_id: str) -> None:
        shutil.rmtree(artifacts_dir(self.settings, run_id), ignore_errors=True)
