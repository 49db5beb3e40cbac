"""`/v1/hosts`: the fleet's sandbox hosts — an admin's list, add, drain and remove, and a
host's own registration and heartbeat.

A host speaks with its own token (`X-Aamp-Host-Token`, made by `POST /v1/hosts` and shown
once), never a user's: its two routes are public to the guard, like signing in, and the
route checks the token in `HostRegistry`, the one place that does. The token is not enough:
a registration over HTTP must name the host's link and carry the proof the host serves there
(`HostLinks.verify`; a replica's own host registers in its process, never here), and its
answer is the life's heartbeat secret, which every heartbeat must carry. A refused host
(wrong token, no link, a link that does not prove it, a stale epoch or wrong secret) is
recorded as a refusal (`host.refused`) naming the host it claimed; its answer says only the
rule, the details (a dial's error) are in the record. The sandboxes a heartbeat's report
makes the control plane forget are recorded too (`sandbox.forgotten`).
"""

from __future__ import annotations

from typing import Annotated

from cryptography.hazmat.primitives import serialization
from fastapi import APIRouter, Header, Path, Request, Response
from pydantic import BaseModel, Field

from aamp.api.body import Body
from aamp.api.guard import cp_of, guarded_router, record_change, request_id, rule
from aamp.errors import AampError
from aamp.fleet import FleetPlacer, HostFacts, HostInfo, HostRefused, HostRegistry, check_host_id
from aamp.fleet.links import LinkNotProven

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
    # Where the host's link listens (HOST:PORT), and the nonce it serves there while this
    # registration is in flight: it must prove its id and this proof there first.
    link: str | None = Field(default=None, max_length=300)
    proof: str | None = Field(default=None, max_length=128)


class HeartbeatIn(Body):
    epoch: int
    # The heartbeat secret its registration returned for this epoch.
    secret: str | None = Field(default=None, max_length=128)
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


class RegisteredLease(HostLease):
    """The answer to a registration: the lease and this life's heartbeat secret (shown only
    now; every heartbeat of this epoch carries it)."""

    heartbeat_secret: str
    # The installation's egress CA certificate (public, PEM): what the host's guest images
    # must trust, since the replicas sign its HTTPS services' leaves with that CA.
    egress_ca: str


class ReportedLease(HostLease):
    """The answer to a heartbeat that reported the host's sandboxes."""

    # Of the sandboxes reported, those with no record here: the host's to destroy.
    unknown: list[str]


def _registry(request: Request) -> HostRegistry:
    return cp_of(request).hosts


async def _as_host(request: Request, host_id: str, call_name: str, call: object) -> HostLease:
    """Run a host's call (`call`: blocking, returns HostInfo). A refusal is recorded as
    `host.refused` (the guard's own record of the call is its public "allow")."""
    try:
        info: HostInfo = await cp_of(request).store.run(call)  # type: ignore[arg-type]
    except AampError as exc:
        await _refused(request, host_id, exc, call_name)
        raise
    return _lease(request, info)


def _lease(request: Request, info: HostInfo) -> HostLease:
    cp = cp_of(request)
    return HostLease(
        id=info.id,
        epoch=info.epoch,
        state=info.state,
        heartbeat_seconds=cp.fleet.interval,
        lost_after_seconds=cp.hosts.lost_after,
    )


async def _refused(request: Request, host_id: str, exc: AampError, call: str) -> None:
    """`host.refused`: the rule the caller was told, and why (a link's dial error), which the
    caller is not told."""
    reason = str(exc)
    if isinstance(exc, LinkNotProven):
        reason += f": {exc.detail}"
    await _host_record(request, host_id, "host.refused", "deny", reason, call)


async def _host_record(
    request: Request,
    host_id: str,
    action: str,
    decision: str,
    reason: str,
    call: str,
    resource: str | None = None,
) -> None:
    address = request.client.host if request.client else "unknown"
    await cp_of(request).audit.record(
        actor=f"host:{host_id}",
        action=action,
        resource=resource or f"host:{host_id}",
        decision=decision,
        reason=reason,
        request_id=request_id(request),
        details={"call": call, "address": address},
    )


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["hosts"])

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
    ) -> RegisteredLease:
        """A host begins a new life (the next epoch) with what it offers, once its link
        proved it is the host and that this registration is its own."""
        cp = cp_of(request)
        try:
            # The token first: an unknown caller never makes a replica dial anywhere.
            await cp.store.run(_registry(request).authenticate, host_id, token)
            if body.link is None:
                raise HostRefused(
                    f"host {host_id!r} refused: a registration must name the host's link"
                    " (`link`, HOST:PORT) and carry the proof it serves there"
                )
            facts = HostFacts(
                drivers=tuple(body.drivers),
                cpus=body.cpus,
                memory_mb=body.memory_mb,
                sandboxes=body.sandboxes,
                images=tuple(body.images),
            )
            await cp.links.verify(host_id, body.link, body.proof)
            info, secret = await cp.store.run(
                _registry(request).register, host_id, token, facts, body.link
            )
        except AampError as exc:
            await _refused(request, host_id, exc, "register")
            raise
        why = f"registered with its token and its link's proof; epoch {info.epoch}"
        await _host_record(request, host_id, "host.registered", "allow", why, "register")
        ca = cp.manager.egress.ca
        assert ca is not None
        return RegisteredLease(
            **_lease(request, info).model_dump(),
            heartbeat_secret=secret,
            egress_ca=ca.certificate.public_bytes(serialization.Encoding.PEM).decode(),
        )

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
            lambda: _registry(request).heartbeat(host_id, token, body.epoch, body.secret, images),
        )
        if body.sandboxes is None:  # a host that reports nothing (a replica's own)
            return lease
        reported = tuple(body.sandboxes)
        placer = cp_of(request).manager.placer
        assert isinstance(placer, FleetPlacer)
        unknown, refused, forgotten = await cp_of(request).store.run(
            placer.settle_report, host_id, body.epoch, reported
        )
        for sandbox_id in forgotten:
            why = (
                f"host {host_id} no longer reports sandbox {sandbox_id} (epoch {body.epoch}):"
                " its record is forgotten and its capacity given back"
            )
            await _host_record(request, host_id, "sandbox.forgotten", "allow", why, "heartbeat",
                               f"sandbox:{sandbox_id}")  # fmt: skip
        if refused:
            why = (
                f"host {host_id} reported sandboxes it may not run: "
                f"{', '.join(refused[:20])}; nothing changed"
            )
            await _host_record(request, host_id, "host.report_refused", "deny", why, "heartbeat")
        return ReportedLease(**lease.model_dump(), unknown=unknown)

    return r
