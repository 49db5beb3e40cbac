"""`/v1/hosts`: the fleet's sandbox hosts — an admin's list, add, drain and remove, and a
host's own registration and heartbeat.

A host speaks with its own token (`X-Aamp-Host-Token`, made by `POST /v1/hosts` and shown
once), never a user's: its two routes are public to the guard, like signing in, and the
route checks the token in `HostRegistry`, the one place that does. A refused host (wrong
token, no such host, a stale epoch) is recorded as a refusal (`host.refused`) naming the
host it claimed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Request, Response
from pydantic import BaseModel, Field

from aamp.api.body import Body
from aamp.api.guard import cp_of, record_change, request_id, rule
from aamp.errors import AampError
from aamp.fleet import FleetPlacer, HostFacts, HostInfo, HostRegistry, check_host_id

HOST_ID = r"^[a-z0-9][a-z0-9.-]{0,62}$"
TOKEN_HEADER = "X-Aamp-Host-Token"
HostId = Annotated[str, Path(pattern=HOST_ID)]
HostToken = Annotated[str, Header(alias=TOKEN_HEADER, max_length=256)]


class AddIn(Body):
    id: str = Field(max_length=63)


class AddedOut(BaseModel):
    """A new host's credentials, shown only now: its token, and its link certificate and key
    from the installation's link CA (with the CA's certificate, which it trusts replicas by)."""

    host: HostInfo
    token: str
    link_cert: str
    link_key: str
    link_ca: str


class RegisterIn(Body):
    drivers: list[str] = Field(max_length=8)
    cpus: int
    memory_mb: int
    sandboxes: int
    images: list[str] = Field(default_factory=list, max_length=256)
    # Where the host's link listens (HOST:PORT); it must prove its id there first.
    link: str | None = Field(default=None, max_length=300)


class HeartbeatIn(Body):
    epoch: int
    images: list[str] | None = Field(default=None, max_length=256)
    # The sandboxes the host runs (a host with a link reports them).
    sandboxes: list[str] | None = Field(default=None, max_length=4096)


class HostLease(BaseModel):
    """What a host is told at registration and at each heartbeat."""

    id: str
    epoch: int
    state: str
    heartbeat_seconds: float
    lost_after_seconds: float


class ReportedLease(HostLease):
    """The answer to a heartbeat that reported the host's sandboxes."""

    # Of the sandboxes reported, those with no record here: the host's to destroy.
    unknown: list[str]


def _registry(request: Request) -> HostRegistry:
    return cp_of(request).hosts


async def _as_host(request: Request, host_id: str, call_name: str, call: object) -> HostLease:
    """Run a host's call (`call`: blocking, returns HostInfo). A refusal is recorded as
    `host.refused` (the guard's own record of the call is its public "allow"); a
    registration as `host.registered`, with its epoch."""
    cp = cp_of(request)
    address = request.client.host if request.client else "unknown"
    try:
        info: HostInfo = await cp.store.run(call)  # type: ignore[arg-type]
    except AampError as exc:
        await _host_record(request, host_id, "host.refused", "deny", str(exc), call_name, address)
        raise
    if call_name == "register":
        why = f"registered with its token; epoch {info.epoch}"
        await _host_record(request, host_id, "host.registered", "allow", why, call_name, address)
    return HostLease(
        id=info.id,
        epoch=info.epoch,
        state=info.state,
        heartbeat_seconds=cp.fleet.interval,
        lost_after_seconds=cp.hosts.lost_after,
    )


async def _host_record(
    request: Request, host_id: str, action: str, decision: str, reason: str, call: str, address: str
) -> None:
    await cp_of(request).audit.record(
        actor=f"host:{host_id}",
        action=action,
        resource=f"host:{host_id}",
        decision=decision,
        reason=reason,
        request_id=request_id(request),
        details={"call": call, "address": address},
    )


def router() -> APIRouter:
    r = APIRouter(prefix="/v1", tags=["hosts"])

    @r.get("/hosts")
    @rule("host.list")
    async def list_hosts(request: Request) -> list[HostInfo]:
        """Every host: state, last heartbeat, capacity and what placements reserved of it."""
        return await cp_of(request).store.run(_registry(request).list)

    @r.post("/hosts", status_code=201)
    @rule("host.add")
    async def add_host(body: AddIn, request: Request) -> AddedOut:
        """Add a host that may then register with the token returned (shown only now)."""
        host_id = check_host_id(body.id)
        by = request.state.actor.audit_name
        info, token = await cp_of(request).store.run(lambda: _registry(request).add(host_id, by=by))
        await record_change(request, "host.added", f"host:{host_id}", {})
        cert, key = await cp_of(request).store.run(cp_of(request).links.ca.issue_host, host_id)
        ca = cp_of(request).links.ca.cert_path.read_text()
        return AddedOut(
            host=info, token=token, link_cert=cert.decode(), link_key=key.decode(), link_ca=ca
        )

    @r.post("/hosts/{host_id}/drain")
    @rule("host.drain")
    async def drain_host(host_id: HostId, request: Request) -> HostInfo:
        """No new work goes to the host; its sandboxes may finish."""
        info = await cp_of(request).store.run(_registry(request).drain, host_id)
        await record_change(request, "host.drained", f"host:{host_id}", {"epoch": info.epoch})
        return info

    @r.delete("/hosts/{host_id}", status_code=204)
    @rule("host.remove")
    async def remove_host(host_id: HostId, request: Request) -> Response:
        """Forget a host that takes no work and runs nothing."""
        await cp_of(request).store.run(_registry(request).remove, host_id)
        await record_change(request, "host.removed", f"host:{host_id}", {})
        return Response(status_code=204)

    @r.post("/hosts/{host_id}/register")
    @rule("host.register")
    async def register_host(
        host_id: HostId, body: RegisterIn, request: Request, token: HostToken
    ) -> HostLease:
        """A host begins a new life (the next epoch) with what it offers."""

        if body.link is not None:
            try:
                # The token first: an unknown caller never makes a replica dial anywhere.
                await cp_of(request).store.run(_registry(request).authenticate, host_id, token)
                await cp_of(request).links.verify(host_id, body.link)
            except AampError as exc:
                address = request.client.host if request.client else "unknown"
                await _host_record(
                    request, host_id, "host.refused", "deny", str(exc), "register", address
                )
                raise

        def call() -> HostInfo:
            facts = HostFacts(
                drivers=tuple(body.drivers),
                cpus=body.cpus,
                memory_mb=body.memory_mb,
                sandboxes=body.sandboxes,
                images=tuple(body.images),
            )
            return _registry(request).register(host_id, token, facts, body.link)

        return await _as_host(request, host_id, "register", call)

    @r.post("/hosts/{host_id}/heartbeat")
    @rule("host.heartbeat")
    async def heartbeat(
        host_id: HostId, body: HeartbeatIn, request: Request, token: HostToken
    ) -> ReportedLease | HostLease:
        """A host is alive under the epoch it registered with."""
        images = None if body.images is None else tuple(body.images)
        lease = await _as_host(
            request,
            host_id,
            "heartbeat",
            lambda: _registry(request).heartbeat(host_id, token, body.epoch, images),
        )
        if body.sandboxes is None:  # a host that reports nothing (a replica's own)
            return lease
        reported = tuple(body.sandboxes)
        placer = cp_of(request).manager.placer
        assert isinstance(placer, FleetPlacer)
        unknown, foreign = await cp_of(request).store.run(
            placer.settle_report, host_id, body.epoch, reported
        )
        if foreign:
            address = request.client.host if request.client else "unknown"
            why = (
                f"host {host_id} reported sandboxes it does not run here: "
                f"{', '.join(foreign[:20])}; nothing changed"
            )
            await _host_record(request, host_id, "host.report_refused", "deny", why, "heartbeat",
                               address)  # fmt: skip
        return ReportedLease(**lease.model_dump(), unknown=unknown)

    return r
