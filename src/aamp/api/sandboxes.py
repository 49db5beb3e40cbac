"""Routes for sandboxes and images: create, list, exec (streamed), files in and out, destroy.

What a create asks for, and the request it makes, are `sandbox_create.py`'s."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field
from starlette.types import Receive, Scope, Send

from aamp.api.body import Body
from aamp.api.context import ControlPlane, SandboxOwner
from aamp.api.errors import ApiError
from aamp.api.guard import (
    actor_of,
    check,
    cp_of,
    guarded_router,
    json_body,
    record_refusal,
    request_id,
    rule,
)
from aamp.api.sandbox_create import SandboxIn, SandboxPlan, create_request
from aamp.identity.authz import allowed
from aamp.identity.model import Actor, Resource
from aamp.policy import MiB
from aamp.sandbox import describe_image, exec_lines, open_download, workspace_path

MAX_STDIN_BYTES = 16 * MiB
MAX_ARGV_ITEMS = 4096


class ExecIn(Body):
    argv: list[str] = Field(min_length=1, max_length=MAX_ARGV_ITEMS)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    stdin_b64: str | None = None
    timeout_seconds: float | None = Field(None, gt=0, le=24 * 3600)


SandboxId = Annotated[str, Path(min_length=1, max_length=64)]


def _sandbox(sandbox_id: str, owner: SandboxOwner | None, **facts: Any) -> Resource:
    """A sandbox as `allowed` sees it: who made it and for which agent (and `facts`)."""
    return Resource(
        "sandbox",
        sandbox_id,
        owner=owner.username if owner else None,
        agent=owner.agent if owner else None,
        **facts,
    )


async def sandbox_resource(request: Request, cp: ControlPlane, _: Actor) -> Resource:
    sandbox_id = str(request.path_params.get("sandbox_id", ""))[:64]
    return _sandbox(sandbox_id, await cp.find_owner(sandbox_id))


def _data_refusal(
    owner: SandboxOwner | None, going: str, path: str, size: int | None
) -> str | None:
    """Why the data rules of the policy the sandbox was made from refuse this file going `in`
    or `out` (`size` None: not known yet), or None; a sandbox made without one has none."""
    if owner is None or owner.data is None:
        return None
    if going == "in":
        return owner.data.inbound.refusal("data.inbound", path, size)
    rule = owner.data.outbound
    refused = rule.refusal("data.outbound", path, size)
    if refused is None and size is not None and rule.needs_approval(size):
        refused = (
            f"{path!r}: {size} bytes; data.outbound.approval needs a person to approve it, "
            "so it leaves only as a run's artifact"
        )
    return refused


async def _file_resource(request: Request, cp: ControlPlane, going: str) -> Resource:
    """A sandbox, and what its data rules say of the file the request moves (by its name, and
    for an upload by its declared length)."""
    sandbox_id = str(request.path_params.get("sandbox_id", ""))[:64]
    owner = await cp.find_owner(sandbox_id)
    path = request.query_params.get("path", "")[:4096]
    length = request.headers.get("content-length", "")
    size = int(length) if going == "in" and length.isdigit() else None
    return _sandbox(sandbox_id, owner, data_refused=_data_refusal(owner, going, path, size))


async def file_in_resource(request: Request, cp: ControlPlane, _: Actor) -> Resource:
    return await _file_resource(request, cp, "in")


async def file_out_resource(request: Request, cp: ControlPlane, _: Actor) -> Resource:
    return await _file_resource(request, cp, "out")


async def _resource_of(cp: ControlPlane, sandbox_id: str) -> Resource:
    return _sandbox(sandbox_id, await cp.find_owner(sandbox_id))


def _admin_only(body: dict[str, Any]) -> str | None:
    """Why only an admin may make this sandbox as asked, or None."""
    agent, policy = body.get("agent"), body.get("policy")
    if body.get("policy_document") is not None:
        return (
            "policy_document: only admins give a policy inline; name a policy granted to the "
            "agent instead"
        )
    if not isinstance(agent, str) or not 1 <= len(agent) <= 32:
        return (
            "agent: a sandbox is made for an agent you can run; name the agent and a policy "
            "granted to it (only admins make sandboxes without them)"
        )
    if not isinstance(policy, str) or not 1 <= len(policy) <= 64:
        return (
            f"policy: name a policy granted to agent:{agent} (only admins make sandboxes "
            "without a policy)"
        )
    return None


async def _new_sandbox(request: Request, cp: ControlPlane, _: Actor) -> Resource:
    """The agent the sandbox is for, whether only an admin may make it as asked, and what of
    the named policy (its image and services) is not granted to that agent."""
    body = await json_body(request)
    agent, policy = body.get("agent"), body.get("policy")
    agent = agent if isinstance(agent, str) and 1 <= len(agent) <= 32 else None
    named = None
    if body.get("policy_document") is None and isinstance(policy, str) and len(policy) <= 64:
        named = await cp.store.run(cp.catalog.agent_needs, agent, policy)
    request.state.sandbox_plan = SandboxPlan(named)
    return Resource(
        "sandbox",
        "new",
        agent=agent,
        admin_only=_admin_only(body),
        ungranted=named.ungranted if named else (),
    )


async def audit_sandbox(
    request: Request,
    action: str,
    sandbox_id: str,
    details: dict[str, Any],
    *,
    decision: str = "allow",
) -> None:
    cp = cp_of(request)
    await cp.audit.record(
        actor=actor_of(request).audit_name,
        action=action,
        resource=f"sandbox:{sandbox_id}",
        decision=decision,
        reason=request.state.decision.reason,
        request_id=request_id(request),
        details=details,
    )


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["sandboxes"])

    @r.get("/images")
    @rule("image.list")
    async def list_images(request: Request) -> list[dict[str, object]]:
        return [describe_image(img) for img in cp_of(request).images.list()]

    @r.post("/sandboxes", status_code=201)
    @rule("sandbox.create", _new_sandbox)
    async def create_sandbox(body: SandboxIn, request: Request) -> dict[str, object]:
        cp, actor = cp_of(request), actor_of(request)
        create, data = await create_request(cp, body, request.state.sandbox_plan)
        sandbox = await cp.manager.create(create, actor=actor.audit_name)
        await cp.record_owner(
            sandbox.id, SandboxOwner(actor.username or "", body.agent, body.policy, data)
        )
        return {
            **sandbox.describe(),
            "owner": actor.username,
            "agent": body.agent,
            "policy": body.policy,
        }

    @r.get("/sandboxes")
    @rule("sandbox.list")
    async def list_sandboxes(request: Request) -> list[dict[str, object]]:
        """The sandboxes you may see: your own (all of them for an admin)."""
        cp = cp_of(request)
        cp.forget_gone_sandboxes()
        out = []
        for s in await cp.manager.list_everywhere():
            resource = await _resource_of(cp, s.id)
            if await check(request, "sandbox.view", resource):
                out.append({**s.describe(), "owner": resource.owner, "agent": resource.agent})
        return out

    @r.get("/sandboxes/{sandbox_id}")
    @rule("sandbox.view", sandbox_resource)
    async def get_sandbox(sandbox_id: SandboxId, request: Request) -> dict[str, object]:
        cp = cp_of(request)
        resource = await _resource_of(cp, sandbox_id)
        return {
            **(await cp.manager.find(sandbox_id)).describe(),
            "owner": resource.owner,
            "agent": resource.agent,
        }

    @r.delete("/sandboxes/{sandbox_id}", status_code=204)
    @rule("sandbox.destroy", sandbox_resource)
    async def delete_sandbox(sandbox_id: SandboxId, request: Request) -> None:
        cp = cp_of(request)
        await cp.manager.destroy(sandbox_id, reason="requested", actor=actor_of(request).audit_name)
        cp.sandbox_owners.pop(sandbox_id, None)

    @r.post("/sandboxes/{sandbox_id}/exec")
    @rule("sandbox.exec", sandbox_resource)
    async def exec_in_sandbox(
        sandbox_id: SandboxId, body: ExecIn, request: Request
    ) -> StreamingResponse:
        manager = cp_of(request).manager
        await manager.find(sandbox_id)  # 404 before the stream starts
        stdin = _decode_stdin(body.stdin_b64)
        await audit_sandbox(
            request,
            "sandbox.exec",
            sandbox_id,
            {
                "argv": body.argv,
                "cwd": body.cwd,
                "env_keys": sorted(body.env),
                "stdin_bytes": len(stdin) if stdin is not None else 0,
            },
        )

        async def recorded(last: dict[str, object]) -> None:
            if "error" in last:
                detail, decision = {"error": last["error"]}, "error"
            else:
                detail, decision = last, "info"
            await audit_sandbox(
                request, "sandbox.exec_result", sandbox_id, detail, decision=decision
            )

        async def events() -> AsyncIterator[bytes]:
            async with manager.use(sandbox_id) as channel:
                session = await channel.exec(
                    body.argv,
                    env=body.env,
                    cwd=body.cwd,
                    stdin=stdin,
                    timeout=body.timeout_seconds,
                )
                async for line in exec_lines(session, recorded):
                    yield line

        return StreamingResponse(events(), media_type="application/x-ndjson")

    @r.put("/sandboxes/{sandbox_id}/files", status_code=204)
    @rule("sandbox.file_in", file_in_resource)
    async def put_file(
        sandbox_id: SandboxId, request: Request, path: Annotated[str, Query(max_length=4096)]
    ) -> None:
        """Upload a file into the sandbox's workspace; its size and SHA-256 are audited."""
        manager = cp_of(request).manager
        guest_path = workspace_path(path)
        size = _content_length(request, manager.settings.max_file_bytes)
        digest = hashlib.sha256()
        seen = 0

        async def hashed() -> AsyncIterator[bytes]:
            nonlocal seen
            async for chunk in request.stream():
                digest.update(chunk)
                seen += len(chunk)
                yield chunk

        try:
            async with manager.use(sandbox_id) as channel:
                await channel.put(guest_path, hashed(), size)
        except BaseException:
            await audit_sandbox(
                request,
                "sandbox.file_in",
                sandbox_id,
                {"path": guest_path, "bytes_seen": seen, "size": size},
                decision="error",
            )
            raise
        await audit_sandbox(
            request,
            "sandbox.file_in",
            sandbox_id,
            {"path": guest_path, "size": seen, "sha256": digest.hexdigest()},
        )

    @r.get("/sandboxes/{sandbox_id}/files")
    @rule("sandbox.file_out", file_out_resource)
    async def get_file(
        sandbox_id: SandboxId, request: Request, path: Annotated[str, Query(max_length=4096)]
    ) -> StreamingResponse:
        """Download a file; its record (size, SHA-256) is durable before the last chunk leaves."""
        manager = cp_of(request).manager
        guest_path = workspace_path(path)
        await manager.find(sandbox_id)
        stream = await open_download(manager, sandbox_id, guest_path)
        # Its size is known only now: the data rules' size and approval bounds are decided
        # here, by `allowed` again, the refusal recorded.
        owner = await cp_of(request).find_owner(sandbox_id)
        refused = _data_refusal(owner, "out", path, stream.size)
        if refused is not None:
            await stream.aclose()
            resource = _sandbox(sandbox_id, owner, data_refused=refused)
            decision = allowed(actor_of(request), "sandbox.file_out", resource)
            assert not decision.allowed
            await record_refusal(request, "sandbox.file_out", str(resource), decision.reason)
            raise ApiError(403, "forbidden", decision.reason)

        digest = hashlib.sha256()
        received = 0
        complete = False
        finished = False

        async def finish() -> None:
            """Drop the guest connection (else it stays open, the guest blocked sending the
            rest), give the sandbox back, and record the transfer: an abandoned download is on
            record too. Once, and shielded: a client that went away cancels at every await."""
            nonlocal finished
            if finished:
                return
            finished = True
            with anyio.CancelScope(shield=True):
                await stream.aclose()
                await audit_sandbox(
                    request,
                    "sandbox.file_out",
                    sandbox_id,
                    {"path": guest_path, "size": received, "sha256": digest.hexdigest()},
                    decision="allow" if complete else "error",
                )

        async def body() -> AsyncIterator[bytes]:
            nonlocal received, complete
            held: bytes | None = None
            async for chunk in stream:
                digest.update(chunk)
                received += len(chunk)
                if held is not None:
                    yield held
                held = chunk
                # Once the client is gone, uvicorn drops what is sent without waiting, and a
                # guest read that finds its buffer full does not wait either: without this the
                # loop could read the whole file before the disconnect is noticed, and record
                # an abandoned download as complete.
                await anyio.sleep(0)
            complete = True
            await finish()  # the record is durable before the last chunk leaves
            if held is not None:
                yield held

        return _StreamWithCleanup(
            body(),
            finish,
            media_type="application/octet-stream",
            headers={"content-length": str(stream.size)},
        )

    return r


class _StreamWithCleanup(StreamingResponse):
    """A streamed body whose clean-up runs however the response ends. Starlette may cancel the
    body before its first line runs (the client was gone before the response started), and an
    unstarted generator's `finally` never runs; so the clean-up hangs on the response."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        cleanup: Callable[[], Awaitable[None]],
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup()


def _decode_stdin(value: str | None) -> bytes | None:
    if value is None:
        return None
    if len(value) > MAX_STDIN_BYTES * 4 // 3 + 4:
        raise ApiError(413, "too_large", f"stdin is limited to {MAX_STDIN_BYTES} bytes")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "invalid_request", "stdin_b64 is not valid base64") from None


def _content_length(request: Request, limit: int) -> int:
    raw = request.headers.get("content-length")
    if raw is None or not raw.isdigit():
        raise ApiError(411, "length_required", "uploads need a Content-Length header")
    size = int(raw)
    if size > limit:
        raise ApiError(413, "too_large", f"the file is {size} bytes; the limit is {limit} bytes")
    return size
