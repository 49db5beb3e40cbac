"""Routes for runs: start one (task + input files), list and read them, follow their steps
live (server-sent events, resumable with Last-Event-ID), cancel, download artifacts, and
answer approval requests.

Who sees a run: its owner while they can still `run` its agent, anyone with `edit` on the
agent, and admins — so operators never see each other's runs. A run's approvals are answered
by the same people: its owner (while they can still `run` its agent), editors of the agent,
and admins.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel, Field

from aamp.agents.versions import AgentVersion, AgentVersions, missing_version
from aamp.api.body import Body
from aamp.api.context import ControlPlane
from aamp.api.errors import ApiError
from aamp.api.guard import (
    actor_of,
    check,
    cp_of,
    guarded_router,
    json_body,
    record_change,
    request_id,
    rule,
)
from aamp.api.run_resolve import resolve_definition
from aamp.catalog.catalog import AgentNeeds
from aamp.errors import NotFound
from aamp.identity.model import Actor, Resource
from aamp.policy import file_type
from aamp.runs.service import RunRequest, RunService
from aamp.runs.store import RunInfo, RunStore

RunId = Annotated[str, Path(min_length=1, max_length=32)]
AgentId = Annotated[str, Path(min_length=1, max_length=32)]
INPUT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,254}\Z")
MAX_INPUTS = 100
EVENTS_PAGE = 500  # steps per store read while streaming
KEEPALIVE_SECONDS = 15.0
MAX_VERSION = 999_999_999


class InputFile(Body):
    name: Annotated[str, Field(min_length=1, max_length=255)]
    content_b64: str


class RunIn(Body):
    task: Annotated[str, Field(min_length=1, max_length=100_000)]
    # A version number is at most 9 digits, as in /agents/{id}/versions/{version}.
    version: Annotated[int, Field(ge=1, le=MAX_VERSION)] | Literal["latest", "draft"] = "latest"
    inputs: Annotated[list[InputFile], Field(max_length=MAX_INPUTS)] = Field(default_factory=list)


class InboundOut(BaseModel):
    """What a run's inputs may be: its policy's `data.inbound`, and nothing else of it."""

    policy: str
    max_bytes: int
    types: list[str]


class ArtifactOut(BaseModel):
    name: str
    size: int
    sha256: str
    created_at: str


class DecisionIn(Body):
    decision: Literal["approve", "deny"]
    note: Annotated[str, Field(max_length=2000)] | None = None


def service_of(cp: ControlPlane) -> RunService:
    if cp.runs is None:
        raise ApiError(503, "unavailable", "runs are not enabled on this control plane")
    return cp.runs


async def _run(request: Request, cp: ControlPlane, _: Actor) -> Resource:
    run_id = str(request.path_params.get("run_id", ""))[:32]
    run = await cp.store.run(RunStore(cp.store).find, run_id)
    if run is None:
        return Resource("run", run_id)
    return Resource("run", run_id, owner=run.owner, agent=run.agent_id)


async def _approval(request: Request, cp: ControlPlane, _: Actor) -> Resource:
    approval_id = str(request.path_params.get("approval_id", ""))[:32]
    store = RunStore(cp.store)

    def lookup() -> Resource:
        try:
            run = store.find(store.get_approval(approval_id)["run_id"])
        except NotFound:
            run = None
        if run is None:
            return Resource("approval", approval_id)
        return Resource("approval", approval_id, owner=run.owner, agent=run.agent_id)

    return await cp.store.run(lookup)


@dataclass(frozen=True)
class RunPlan:
    """What the resolver found for a new run — the version asked for, its policy and model
    endpoint as the agent would use them — which `allowed` decides on and the route then
    starts, unchanged."""

    version: AgentVersion | None
    needs: AgentNeeds | None


def _version_asked(body: dict[str, Any]) -> str | int | None:
    """The body's `version` if it is one RunIn accepts (else None: the route's 422 says why)."""
    which = body.get("version", "latest")
    if which in ("latest", "draft"):
        return str(which)
    if isinstance(which, int) and not isinstance(which, bool) and 1 <= which <= MAX_VERSION:
        return which
    return None


async def _planned(request: Request, cp: ControlPlane, which: str | int | None) -> Resource:
    """The agent, whether the version asked for is a published one, what of its policy (image,
    services) and model endpoint is not granted to the agent, and whether that endpoint is
    still unconfirmed — with the plan kept for the route (`request.state.run_plan`)."""
    agent_id = str(request.path_params.get("agent_id", ""))[:32]
    if which is None:
        request.state.run_plan = RunPlan(None, None)
        return Resource("agent", agent_id, agent=agent_id)

    def plan() -> RunPlan:
        version = AgentVersions(cp.store).find(agent_id, which)
        if version is None:
            return RunPlan(None, None)
        d = version.definition
        return RunPlan(
            version,
            cp.catalog.agent_needs(
                agent_id, d.policy, endpoint=d.model.endpoint, knowledge_bases=d.knowledge_bases
            ),
        )

    found = await cp.store.run(plan)
    request.state.run_plan = found
    published = found.version is not None and found.version.status == "published"
    endpoint = found.needs.endpoint if found.needs else None
    return Resource(
        "agent",
        agent_id,
        agent=agent_id,
        ungranted=found.needs.ungranted if found.needs else (),
        unpublished=None if which == "latest" or published else str(which),
        unconfirmed=endpoint.name if endpoint is not None and not endpoint.confirmed else None,
    )


async def _new_run(request: Request, cp: ControlPlane, _: Actor) -> Resource:
    """A run about to start: the version its body asks for."""
    return await _planned(request, cp, _version_asked(await json_body(request)))


async def _run_inbound(request: Request, cp: ControlPlane, _: Actor) -> Resource:
    """What a run would accept: the version `?version=` asks for, decided as a run of it."""
    which = request.query_params.get("version", "latest")[:12]
    asked = int(which) if which.isdigit() else which
    return await _planned(request, cp, _version_asked({"version": asked}))


def _decode_inputs(body: RunIn) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for i, item in enumerate(body.inputs):
        if not INPUT_NAME_RE.match(item.name):
            raise ApiError(
                400, "invalid_request", f"inputs[{i}].name: {item.name!r} is not a plain file name"
            )
        if item.name in (n for n, _ in out):
            raise ApiError(
                400, "invalid_request", f"inputs[{i}].name: {item.name!r} is given twice"
            )
        try:
            out.append((item.name, base64.b64decode(item.content_b64, validate=True)))
        except (binascii.Error, ValueError):
            raise ApiError(
                400, "invalid_request", f"inputs[{i}].content_b64 is not valid base64"
            ) from None
    return out


async def _refuse_input(request: Request, agent_id: str, message: str, details: dict) -> None:
    cp = cp_of(request)
    await cp.audit.record(
        actor=actor_of(request).audit_name,
        action="run.file_in",
        resource=f"agent:{agent_id}",
        decision="deny",
        reason=message,
        request_id=request_id(request),
        details=details,
    )


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["runs"])

    @r.get("/agents/{agent_id}/inbound", response_model=InboundOut)
    @rule("run.inbound", _run_inbound)
    async def run_inbound(
        agent_id: AgentId,
        request: Request,
        version: Annotated[str, Query(pattern=r"^(latest|draft|[1-9][0-9]{0,8})$")] = "latest",
    ) -> dict[str, Any]:
        """The input files a run of this version accepts (its policy's `data.inbound`), for a
        check before upload; decided exactly as starting that run, whose own check stays the
        authority. Nothing else of the policy is shown."""
        plan: RunPlan = request.state.run_plan
        if plan.version is None:
            raise ApiError(404, "not_found", missing_version(agent_id, version))
        name = plan.version.definition.policy
        if plan.needs is None or plan.needs.policy is None:
            raise ApiError(400, "invalid_request", f"policy: no policy named {name!r}")
        inbound = plan.needs.policy.policy.data.inbound
        return {"policy": name, "max_bytes": inbound.max_bytes, "types": list(inbound.types)}

    @r.post("/agents/{agent_id}/runs", status_code=201, response_model=RunInfo)
    @rule("run.create", _new_run)
    async def create_run(agent_id: AgentId, body: RunIn, request: Request) -> dict[str, Any]:
        """Start a run of a published version (`latest` or a number); the draft, or any
        unpublished number, only for users with `edit`. Inputs go to /workspace/in, checked
        against the policy's `data.inbound`."""
        cp, actor = cp_of(request), actor_of(request)
        runs = service_of(cp)
        plan: RunPlan = request.state.run_plan
        if plan.version is None:
            raise ApiError(404, "not_found", missing_version(agent_id, body.version))
        version, d, needs = plan.version, plan.version.definition, plan.needs
        assert needs is not None  # found with the version
        policy, create, services, indexes = await resolve_definition(cp, d, needs)
        inputs = _decode_inputs(body)
        inbound = policy.data.inbound
        total = 0
        for name, data in inputs:
            kind = file_type(name)
            if kind not in inbound.types:
                message = (
                    f"{name}: data.inbound.types of policy {d.policy!r} does not allow "
                    f"{kind or 'no extension'!r} (allowed: {', '.join(inbound.types) or 'none'})"
                )
                await _refuse_input(request, agent_id, message, {"name": name, "size": len(data)})
                raise ApiError(400, "data_refused", message)
            total += len(data)
            if total > inbound.max_bytes:
                message = f"inputs: data.inbound.max_bytes is {inbound.max_bytes} bytes"
                await _refuse_input(request, agent_id, message, {"name": name, "total": total})
                raise ApiError(413, "too_large", message)
        run = await cp.store.run(
            lambda: runs.runs.create(
                agent_id, version.version, actor.username or "", body.task, tuple(inputs)
            )
        )
        await record_change(
            request,
            "run.created",
            f"run:{run.id}",
            {"agent": agent_id, "version": version.version, "inputs": [n for n, _ in inputs]},
        )
        await runs.emit(
            run.id,
            "run.queued",
            {"task": body.task, "version": version.version, "by": actor.audit_name},
        )
        runs.start(
            RunRequest(
                run,
                d,
                policy,
                create,
                tuple(inputs),
                services,
                actor.audit_name,
                needs.endpoint,
                indexes,
            )
        )
        return run.to_dict()

    @r.get("/runs", response_model=list[RunInfo])
    @rule("run.list")
    async def list_runs(
        request: Request,
        response: Response,
        agent: Annotated[str | None, Query(max_length=32)] = None,
        status: Annotated[str | None, Query(max_length=32)] = None,
        before: Annotated[str | None, Query(max_length=32)] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 200,
    ) -> list[dict[str, Any]]:
        """The runs you may see (yours; all of an agent you edit; all for an admin), newest
        first. A page read `limit` runs from the store; when it did, `X-Next-Before` names the
        last one read, for `?before=` to go on (fewer may be shown: those you may not see)."""
        cp, actor = cp_of(request), actor_of(request)
        # Operators see their own runs only (they never have `edit`), so only those are read;
        # `check` below still decides each one.
        owner = (
            actor.username if actor.role is not None and actor.role.value == "operator" else None
        )
        found = await cp.store.run(
            lambda: RunStore(cp.store).list(
                owner=owner, agent=agent, status=status, before=before, limit=limit
            )
        )
        if len(found) == limit:
            response.headers["x-next-before"] = found[-1].id
        return [
            run.to_dict()
            for run in found
            if await check(
                request, "run.view", Resource("run", run.id, owner=run.owner, agent=run.agent_id)
            )
        ]

    @r.get("/runs/{run_id}", response_model=RunInfo)
    @rule("run.view", _run)
    async def get_run(run_id: RunId, request: Request) -> dict[str, Any]:
        cp = cp_of(request)
        return (await cp.store.run(RunStore(cp.store).get, run_id)).to_dict()

    @r.get(
        "/runs/{run_id}/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    @rule("run.view", _run)
    async def run_events(
        run_id: RunId,
        request: Request,
        after: Annotated[int | None, Query(ge=0)] = None,
    ) -> StreamingResponse:
        """The run's steps as server-sent events, live; ends after `run.finished`. Resume with
        the `Last-Event-ID` header (or `?after=N`): only steps after that one are sent."""
        cp = cp_of(request)
        store = RunStore(cp.store)
        await cp.store.run(store.get, run_id)  # 404 before the stream starts
        last = request.headers.get("last-event-id", "")
        seq = int(last) if last.isdigit() else (after or 0)
        service = service_of(cp)

        async def stream() -> AsyncIterator[bytes]:
            nonlocal seq
            settled = False
            while True:
                waiter = service.bus.waiter(run_id)
                batch = await cp.store.run(store.events_after, run_id, seq, EVENTS_PAGE)
                for event in batch:
                    seq = event.seq
                    data = json.dumps(event.data, separators=(",", ":"))
                    yield f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n".encode()
                if any(e.type == "run.finished" for e in batch):
                    service.bus.notify(run_id)  # wakes other readers; drops the waiter taken
                    return
                if len(batch) == EVENTS_PAGE:
                    continue  # a full page: more are stored already
                if settled:
                    service.bus.notify(run_id)
                    return
                # The waiter was taken before the read, so a step stored since wakes it at once.
                # A run that ended without a `run.finished` (its driver died just before) ends
                # the stream once its driver, on whichever replica, is done with it: after one
                # more read, for the steps stored since this one.
                if not batch and not service.live(run_id):
                    settled = await cp.store.run(store.settled, run_id)
                    if settled:
                        continue
                if await request.is_disconnected():
                    return
                if not await service.bus.wait(waiter, KEEPALIVE_SECONDS):
                    yield b": keep-alive\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    @r.post("/runs/{run_id}/cancel", response_model=RunInfo)
    @rule("run.cancel", _run)
    async def cancel_run(run_id: RunId, request: Request) -> dict[str, Any]:
        """Cancel a run at any point; its sandbox is destroyed."""
        cp, actor = cp_of(request), actor_of(request)
        service = service_of(cp)
        run = await cp.store.run(service.runs.get, run_id)
        if run.finished:
            raise ApiError(409, "conflict", f"run {run_id} already ended ({run.status})")
        await record_change(request, "run.cancel", f"run:{run_id}", {})
        await service.cancel(run_id, by=actor.audit_name)
        return (await cp.store.run(service.runs.get, run_id)).to_dict()

    @r.get("/runs/{run_id}/artifacts", response_model=list[ArtifactOut])
    @rule("run.view", _run)
    async def list_artifacts(run_id: RunId, request: Request) -> list[dict[str, Any]]:
        cp = cp_of(request)
        store = RunStore(cp.store)
        await cp.store.run(store.get, run_id)
        return await cp.store.run(store.artifacts, run_id)

    @r.get(
        "/runs/{run_id}/artifacts/{name:path}",
        response_class=FileResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    @rule("run.artifact", _run)
    async def get_artifact(
        run_id: RunId, name: Annotated[str, Path(min_length=1, max_length=255)], request: Request
    ) -> FileResponse:
        """Download an artifact; its name, size and SHA-256 are audited."""
        cp = cp_of(request)
        service = service_of(cp)
        path, item = await cp.store.run(service.artifact_path, run_id, name)
        if not path.is_file():
            raise ApiError(404, "not_found", f"the bytes of artifact {name!r} are gone")
        await record_change(request, "run.artifact_download", f"run:{run_id}", item)
        return FileResponse(
            path,
            media_type="application/octet-stream",
            filename=name.rsplit("/", 1)[-1],
        )

    @r.get("/approvals")
    @rule("approval.list")
    async def list_approvals(
        request: Request,
        pending: Annotated[bool, Query()] = True,
        run_id: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    ) -> list[dict[str, Any]]:
        """Approval requests you may answer (of your own runs, of runs of agents you edit,
        or any, as an admin), optionally of one run only."""
        cp = cp_of(request)
        store = RunStore(cp.store)
        out = []
        asked = await cp.store.run(lambda: store.approvals(pending_only=pending, run_id=run_id))
        for item in asked:
            run = await cp.store.run(store.find, item["run_id"])
            agent = run.agent_id if run else None
            owner = run.owner if run else None
            if await check(
                request,
                "approval.decide",
                Resource("approval", item["id"], owner=owner, agent=agent),
            ):
                out.append({**item, "agent_id": agent})
        return out

    @r.post("/approvals/{approval_id}")
    @rule("approval.decide", _approval)
    async def decide(
        approval_id: Annotated[str, Path(min_length=1, max_length=32)],
        body: DecisionIn,
        request: Request,
    ) -> dict[str, Any]:
        """Approve or deny a paused run's request; the run resumes or fails."""
        cp, actor = cp_of(request), actor_of(request)
        decided = await service_of(cp).decide(
            approval_id, body.decision == "approve", by=actor.audit_name, note=body.note
        )
        await record_change(
            request,
            f"approval.{decided['status']}",
            f"run:{decided['run_id']}",
            {"approval": approval_id, "note": body.note},
        )
        return decided

    return r
