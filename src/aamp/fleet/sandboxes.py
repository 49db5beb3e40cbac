"""`FleetPlacer`: the sandbox manager's placer (`aamp.sandbox.placer`) — every sandbox is
placed through `Placement` (its host's capacity reserved in the placement's transaction) and
recorded as a `sandboxes` row naming its host and the host's epoch; destroying it gives the
capacity back and forgets the row.

The candidates are the hosts this replica can drive: the one in its own process (none for
`aamp up --role api`), and the hosts on other machines that registered a link (`aamp host
serve`; `link_client.py`); with none to ask, a create is refused (503 `no_capacity`) saying
that no host is available. Every create can go to any of them: egress rules and services
travel with the create (their credentials never: the host asks for them call by
call, `credentials.py`, and a replica signs its HTTPS services' leaves, `leaves.py`), and so
do its packages: resolved in this replica's wheelhouse before anything is reserved
(placement prefers a host that reports their layer built), their wheels offered to the host
by SHA-256 and the ones it lacks sent (`received_wheels.py`); a host that cannot take them
is recorded as refusing them (`host.packages_refused`) and the create says why; and its
read-only files (by hash: `host_files.py`). A sandbox placed on
a remote host is booted there over the link and recorded here; any replica then reaches it
through the link (`find`), never the guest directly — and changes its egress rules and
services (`update_egress_elsewhere`, its row's granted services with them) and views its
egress events (`egress_view_elsewhere`: its host's view, checked) the same way.

When a host is marked lost (`HostRegistry.mark_lost`) its rows become `lost` with the reason;
`lost` tells the run service which of its runs' sandboxes are gone and why. A remote host's
heartbeat reports what it runs (`settle_report`): a row it no longer reports (its ttl or
idle ended it there) is forgotten and its capacity given back, and the API audits each one
forgotten (`sandbox.forgotten`). Only a heartbeat proven to be the host's current life (its
token, epoch and heartbeat secret: `HostRegistry.heartbeat`) reaches it.

Every row carries its expiry (`expires_at`: its create's time plus its ttl). Whatever a host
says or asks for a sandbox is judged by one rule (`refusal`): the sandbox is recorded on that
host, live, in the host's current life, and not past its expiry — a compromised host that
keeps a sandbox past its ttl gets no credential for it (`credentials.py`) and none of its
records or reports for it are taken (`collector.py`, `settle_report`). Its host's own clock
ends a sandbox at its ttl; one still recorded `REAP_GRACE_SECONDS` later is reaped by the
fleet's sweep (`reap_expired`): its row taken in one transaction (so one replica reaps it),
its capacity given back, its host told to destroy it, and the manager records it as its own
clock records its own (`sandbox.destroy`, reason `ttl`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aamp.egress.rules import EgressRules
from aamp.egress.services import ServiceSet
from aamp.fleet.link_client import LinkAnswer, LinkClient, LinkError
from aamp.fleet.link_egress import LinkEgressView
from aamp.fleet.links import HostLinks
from aamp.fleet.placement import Need, NoCapacity, Placed, Placement, give_back
from aamp.sandbox.image_derive import packages_key
from aamp.sandbox.manager import (
    CreateRequest,
    InvalidRequest,
    SandboxStopped,
    SandboxUnavailable,
    UnknownSandbox,
)
from aamp.sandbox.received_wheels import WheelRef
from aamp.sandbox.wheelhouse import Wheelhouse, WheelhouseError
from aamp.store import Store, time_at, values_where
from aamp.store.tables import HostRow, SandboxRow
from aamp.store.timestamps import now

log = logging.getLogger("aamp.fleet")
MIB = 2**20
# A sandbox a host does not report yet may be one it has just made: forgotten only after this.
REPORT_GRACE_SECONDS = 30
# A host ends its sandboxes at their ttl itself and its next heartbeat (every 3 s by default)
# says so; one still recorded this long after is reaped.
REAP_GRACE_SECONDS = 10.0


def refusal(s: Session, host_id: str, sandbox_id: str, at: str) -> str | None:
    """In session `s`: why host `host_id` may not speak or ask for `sandbox_id` at time `at`
    (stored text); None if it may. The one rule for every ask and report of a host."""
    row = s.get(SandboxRow, sandbox_id)
    if row is None or row.host_id != host_id:
        return f"sandbox {sandbox_id} is not placed on host {host_id}"
    host = s.get(HostRow, host_id)
    if row.state != "live" or host is None or host.epoch != row.host_epoch:
        return f"sandbox {sandbox_id} is not live on host {host_id}'s current life"
    if row.expires_at <= at:
        return f"sandbox {sandbox_id} expired at {row.expires_at} (its ttl)"
    return None


# A host waits this much longer than the run's approval timeout for the replica's answer (the
# run answers "expired" itself at its timeout; this is for a replica that died meanwhile).
APPROVAL_MARGIN = 30.0

# The codes a host answers a create's packages with when it cannot build their layer
# (`link_server.py`): recorded as the host's refusal (`host.packages_refused`).
PACKAGES_REFUSALS = frozenset({"wheel_refused", "packages_refused"})

# What a replica that runs no sandbox (`aamp up --role api`) answers when no host can be asked.
NO_HOST = (
    "no sandbox host is available: this replica runs no sandboxes of its own (aamp up --role"
    " api) and no host has registered a link (`aamp host add ID`, then `aamp host serve` there)"
)


def granted_services(s: Session, sandbox_id: str) -> list[str]:
    """In session `s`: the services the sandbox's create was granted (none if no record)."""
    row = s.get(SandboxRow, sandbox_id)
    return json.loads(row.services or "[]") if row is not None else []


@dataclass(frozen=True)
class Reservation:
    placed: Placed
    need: Need
    wheels: tuple[WheelRef, ...] = ()  # of its packages, from this replica's wheelhouse


@dataclass
class RemoteSandbox:
    """A sandbox on another host, as a replica sees it: what its host says, and its link."""

    info: dict[str, Any]
    link: LinkClient

    @property
    def id(self) -> str:
        return str(self.info["id"])

    @property
    def image(self) -> str:
        return str(self.info["image"])

    @property
    def driver(self) -> str:
        return str(self.info["driver"])

    @property
    def warm(self) -> bool:
        return bool(self.info.get("warm"))

    @property
    def host(self) -> str:
        return self.link.host_id

    def describe(self) -> dict[str, object]:
        return {**self.info, "host": self.link.host_id}


class FleetPlacer:
    def __init__(
        self, placement: Placement, host_id: str | None, links: HostLinks, wheelhouse: Wheelhouse
    ) -> None:
        self.placement = placement
        self.host_id = host_id  # the host in this process (None: `aamp up --role api`)
        self.links = links
        # Where a create's packages come from: sent from here to a host on another machine.
        self.wheelhouse = wheelhouse

    @property
    def store(self) -> Store:
        return self.placement.registry.store

    async def reserve(self, driver: str, request: CreateRequest) -> Reservation:
        image, resources, packages = request.image, request.resources, request.packages
        wheels: tuple[WheelRef, ...] = ()
        layer = None
        if packages:  # resolved before anything is reserved; a host checks the dependencies
            try:
                chosen = await asyncio.to_thread(self.wheelhouse.chosen, packages)
            except WheelhouseError as exc:
                raise InvalidRequest(str(exc)) from None
            wheels = tuple(WheelRef(w.sha256, w.filename) for w in chosen)
            layer = f"{image}+{packages_key(w.sha256 for w in wheels)}"
        memory_mb = math.ceil(resources.memory_bytes / MIB)
        need = Need(driver, image, resources.cpus, memory_mb, layer=layer)

        def place() -> Placed:
            remote = tuple(self.placement.registry.linked())
            own = (self.host_id,) if self.host_id is not None else ()
            if not own and not remote:
                raise NoCapacity(NO_HOST)
            return self.placement.place(need, (*own, *remote))

        return Reservation(await self.store.run(place), need, wheels)

    def _link_of(self, host_id: str) -> LinkClient | None:
        if host_id == self.host_id:
            return None
        with self.store.session() as s:
            row = s.get(HostRow, host_id)
            address = row.link_address if row is not None else None
        return self.links.client(host_id, address) if address else None

    async def boot_elsewhere(
        self, reservation: object, request: CreateRequest, actor: str
    ) -> RemoteSandbox | None:
        """Boot the sandbox on its remote host (None: it was placed on this process's
        own); recorded once it is up, destroyed there if it cannot be recorded."""
        assert isinstance(reservation, Reservation)
        link = await self.store.run(self._link_of, reservation.placed.host_id)
        if link is None:
            return None
        try:
            if reservation.wheels:
                await self._send_wheels(link, reservation.wheels)
            info = await link.create(request, reservation.placed.epoch, actor, reservation.wheels)
        except LinkAnswer as exc:
            if exc.code not in PACKAGES_REFUSALS:
                raise
            why = f"host {link.host_id} refused the packages: {exc}"
            await self.links.packages_refused(link.host_id, why)
            raise (InvalidRequest if exc.status < 500 else SandboxUnavailable)(why) from None
        sandbox = RemoteSandbox(info, link)
        try:
            await self.placed(reservation, sandbox.id, request.ttl, request.services.names)
        except BaseException:
            # Unreachable now: the host's next report destroys it (it has no record here).
            with contextlib.suppress(Exception):
                await link.destroy(sandbox.id, "it could not be recorded", actor)
            raise
        return sandbox

    async def _send_wheels(self, link: LinkClient, wheels: tuple[WheelRef, ...]) -> None:
        """Offer the host the wheels by SHA-256 and send each one it lacks."""
        _, body = await link.request(
            "POST", "/link/wheels", json={"wheels": [w.to_dict() for w in wheels]}
        )
        try:
            lacking = json.loads(body)["lacking"]
            if not isinstance(lacking, list):
                raise TypeError("lacking")
        except (ValueError, KeyError, TypeError):
            raise await link.refuse(
                "POST /link/wheels: not a list of the wheels it lacks"
            ) from None
        for ref in wheels:
            if ref.sha256 in lacking:
                await link.send_wheel(ref, self.wheelhouse.root / ref.filename)

    async def placed(
        self, reservation: object, sandbox_id: str, ttl: float, services: tuple[str, ...] = ()
    ) -> str:
        """Record the sandbox on its host, with its expiry (now plus `ttl`) and the services
        its create was granted (the only ones its host may ask credentials for:
        `credentials.py`)."""
        assert isinstance(reservation, Reservation)
        placed, need = reservation.placed, reservation.need
        at = self.placement.registry.clock()

        def record() -> None:
            with self.store.write_session() as s:
                host = s.get(HostRow, placed.host_id, with_for_update=True)
                if host is None or host.epoch != placed.epoch or host.state == "lost":
                    raise NoCapacity(
                        f"host {placed.host_id} was lost or registered again while sandbox "
                        f"{sandbox_id} started; it is not used"
                    )
                s.add(
                    SandboxRow(
                        id=sandbox_id,
                        host_id=placed.host_id,
                        host_epoch=placed.epoch,
                        state="live",
                        millicpus=need.millicpus,
                        memory_mb=need.memory_mb,
                        created_at=time_at(at),
                        expires_at=time_at(at + ttl),
                        services=json.dumps(list(services)),
                    )
                )

        await self.store.run(record)
        return placed.host_id

    async def cancel(self, reservation: object) -> None:
        assert isinstance(reservation, Reservation)
        await self.store.run(self.placement.release, reservation.placed, reservation.need)

    async def release(self, sandbox_id: str) -> None:
        def forget() -> None:
            with self.store.write_session() as s:
                row = s.get(SandboxRow, sandbox_id, with_for_update=True)
                if row is None:
                    return  # its host registered again since: nothing is reserved
                give_back(s, row.host_id, row.host_epoch, row.millicpus, row.memory_mb)
                s.delete(row)

        await self.store.run(forget)

    def record_owner(  # type: ignore[no-untyped-def]
        self,
        sandbox_id: str,
        owner: str,
        agent: str | None,
        policy: str | None,
        data_rules: str | None = None,
    ):
        """(Blocking.) Who made the sandbox and for what (and its policy's data rules, as
        JSON), for every replica's checks."""
        with self.store.write_session() as s:
            row = s.get(SandboxRow, sandbox_id, with_for_update=True)
            if row is not None:
                row.owner, row.agent, row.policy = owner, agent, policy
                row.data_rules = data_rules

    def owner_of(self, sandbox_id: str) -> tuple[str, str | None, str | None, str | None] | None:
        """(Blocking.) The recorded (owner, agent, policy, data rules) of a sandbox, if any."""
        with self.store.session() as s:
            row = s.get(SandboxRow, sandbox_id)
            if row is None or row.owner is None:
                return None
            return row.owner, row.agent, row.policy, row.data_rules

    async def find(self, sandbox_id: str) -> RemoteSandbox:
        """A sandbox on a remote host, as its host describes it now; `UnknownSandbox` if
        there is no such sandbox anywhere, `SandboxStopped` if it was lost with its host or is
        past its expiry (its host kept it: nothing of it is used; the sweep reaps it)."""

        def row_of() -> tuple[str, str | None, str | None] | None:
            with self.store.session() as s:
                row = s.get(SandboxRow, sandbox_id)
                if row is None or row.host_id == self.host_id:
                    return None
                host = s.get(HostRow, row.host_id)
                ended = None
                if row.state == "lost":
                    ended = f"was lost: {row.lost_reason or 'its host was lost'}"
                elif row.expires_at <= now():
                    ended = f"expired at {row.expires_at} (its ttl)"
                return row.host_id, host.link_address if host else None, ended

        found = await self.store.run(row_of) if len(sandbox_id) <= 64 else None
        if found is None or found[1] is None:
            raise UnknownSandbox(f"no sandbox {sandbox_id!r}")
        host_id, address, ended = found
        if ended is not None:
            raise SandboxStopped(f"sandbox {sandbox_id} {ended}")
        link = self.links.client(host_id, address)  # type: ignore[arg-type]
        try:
            return RemoteSandbox(await link.describe(sandbox_id), link)
        except LinkAnswer as exc:
            if exc.status == 404:
                raise UnknownSandbox(f"no sandbox {sandbox_id!r}") from None
            raise

    async def destroy_elsewhere(self, sandbox_id: str, reason: str, actor: str) -> str | None:
        """Destroy a sandbox on its remote host and give its capacity back; its host's id, or
        None if it is not on a remote host. One lost with its host is only forgotten; one
        whose host does not answer is forgotten too — the host, finding no record of it in
        its next heartbeat's answer, destroys it."""

        def row_of() -> tuple[str, str | None, bool] | None:
            with self.store.session() as s:
                row = s.get(SandboxRow, sandbox_id)
                if row is None or row.host_id == self.host_id:
                    return None
                host = s.get(HostRow, row.host_id)
                return row.host_id, host.link_address if host else None, row.state == "lost"

        found = await self.store.run(row_of) if len(sandbox_id) <= 64 else None
        if found is None:
            return None
        host_id, address, lost = found
        try:
            if address is not None and not lost:
                await self.links.client(host_id, address).destroy(sandbox_id, reason, actor)
        except LinkAnswer as exc:
            if exc.status != 404:
                raise
        except LinkError as exc:
            log.warning("sandbox %s: its host did not answer (%s); it destroys it", sandbox_id, exc)
        finally:
            await self.release(sandbox_id)
        return host_id

    async def approver_elsewhere(self, sandbox_id: str, answering: bool, timeout: float) -> None:
        remote = await self.find(sandbox_id)
        replica = self.host_id if answering else None
        body = {"replica": replica, "timeout": timeout + APPROVAL_MARGIN}
        await remote.link.request("POST", f"/link/sandboxes/{sandbox_id}/approver", json=body)

    async def update_egress_elsewhere(
        self,
        sandbox: object,
        rules: EgressRules,
        services: ServiceSet | None,
        actor: str,
    ) -> None:
        """New rules (and services) for a sandbox on a remote host, over its link. New
        services are granted on its row first (its host may ask for their credentials as
        soon as its proxy has them: `credentials.py`), and given back as they were if its
        host was not told."""
        assert isinstance(sandbox, RemoteSandbox)
        before = None
        if services is not None:
            before = await self.store.run(self._grant, sandbox.id, list(services.names))
        try:
            await sandbox.link.update_egress(sandbox.id, rules, services, actor)
        except BaseException:
            if before is not None:
                with contextlib.suppress(Exception):
                    await self.store.run(self._grant, sandbox.id, before)
            raise

    def _grant(self, sandbox_id: str, services: list[str]) -> list[str]:
        """(Blocking.) Record `services` as the sandbox's granted ones; those it had."""
        with self.store.write_session() as s:
            row = s.get(SandboxRow, sandbox_id, with_for_update=True)
            if row is None:
                raise UnknownSandbox(f"no sandbox {sandbox_id!r}")
            had = json.loads(row.services or "[]")
            row.services = json.dumps(services)
            return list(had)

    def egress_view_elsewhere(self, sandbox: object) -> LinkEgressView:
        """The sandbox's egress events as its host's proxy decides them (`link_egress.py`),
        checked against the services its row grants it."""
        assert isinstance(sandbox, RemoteSandbox)
        sandbox_id = sandbox.id

        def granted() -> list[str]:
            with self.store.session() as s:
                return granted_services(s, sandbox_id)

        return LinkEgressView(sandbox.link, sandbox_id, lambda: self.store.run(granted))

    async def elsewhere(self) -> list[RemoteSandbox]:
        """Every live sandbox recorded on a remote host, as their hosts describe them."""

        def hosts() -> dict[str, tuple[str, set[str]]]:
            with self.store.session() as s:
                rows = s.execute(
                    select(SandboxRow.id, SandboxRow.host_id, HostRow.link_address)
                    .join(HostRow, HostRow.id == SandboxRow.host_id)
                    .where(
                        SandboxRow.state == "live",
                        SandboxRow.expires_at > now(),  # one its host kept: not listed
                        HostRow.link_address.is_not(None),
                        SandboxRow.host_id != self.host_id,  # this process lists its own
                    )
                ).all()
            out: dict[str, tuple[str, set[str]]] = {}
            for r in rows:
                out.setdefault(r.host_id, (r.link_address, set()))[1].add(r.id)
            return out

        found: list[RemoteSandbox] = []
        for host_id, (address, ids) in (await self.store.run(hosts)).items():
            link = self.links.client(host_id, address)
            try:
                listed = await link.list()
            except Exception:  # an unreachable host lists nothing; its heartbeat decides
                continue
            found += [RemoteSandbox(i, link) for i in listed if i.get("id") in ids]
        return found

    def settle_report(
        self, host_id: str, epoch: int, reported: tuple[str, ...]
    ) -> tuple[list[str], list[str], list[str]]:
        """(Blocking.) A host's heartbeat (already checked as its current life's) said it runs
        `reported`: forget (and give back the capacity of) its rows in this epoch it no longer
        runs. Returns the reported sandboxes it may not run (`unknown`: the host's to destroy
        — no record at all, or past its expiry), the claims refused (`refused`: each one
        recorded elsewhere or expired, with why; nothing changes for them), and the rows
        forgotten (`forgotten`, for the caller to audit)."""
        clock = self.placement.registry.clock()
        cutoff, at = time_at(clock - REPORT_GRACE_SECONDS), time_at(clock)
        forgotten: list[str] = []
        with self.store.write_session() as s:
            mine = s.scalars(
                select(SandboxRow).where(
                    SandboxRow.host_id == host_id,
                    SandboxRow.host_epoch == epoch,
                    SandboxRow.state == "live",
                )
            ).all()
            for row in mine:
                if row.id not in reported and row.created_at < cutoff:
                    give_back(s, row.host_id, row.host_epoch, row.millicpus, row.memory_mb)
                    s.delete(row)
                    forgotten.append(row.id)
            known = {
                r.id: (r.host_id, r.host_epoch, r.expires_at)
                for r in s.execute(
                    select(
                        SandboxRow.id,
                        SandboxRow.host_id,
                        SandboxRow.host_epoch,
                        SandboxRow.expires_at,
                    ).where(SandboxRow.id.in_(reported))
                ).all()
            }
        unknown = [i for i in reported if i not in known]
        refused = sorted(i for i, (h, e, _) in known.items() if (h, e) != (host_id, epoch))
        expired = sorted(
            i for i, (h, e, x) in known.items() if (h, e) == (host_id, epoch) and x <= at
        )
        return unknown + expired, refused + [f"{i} (expired)" for i in expired], sorted(forgotten)

    async def reap_expired(self) -> list[tuple[str, str]]:
        """Every live sandbox on another host still recorded `REAP_GRACE_SECONDS` past its
        expiry (its host did not end it at its ttl): its row is taken and its capacity given
        back in one transaction (so exactly one replica reaps it), then its host is told to
        destroy it (one that does not answer destroys it at its next heartbeat, which finds
        no record of it). Returns each (sandbox, host) reaped, for the manager to record."""

        def claim() -> list[tuple[str, str, str | None]]:
            cutoff = time_at(self.placement.registry.clock() - REAP_GRACE_SECONDS)
            taken: list[tuple[str, str, str | None]] = []
            with self.store.write_session() as s:
                rows = s.scalars(
                    select(SandboxRow)
                    .where(
                        SandboxRow.state == "live",
                        SandboxRow.expires_at < cutoff,
                        SandboxRow.host_id != self.host_id,  # its own clock reaps its own
                    )
                    .with_for_update(skip_locked=True)
                ).all()
                for row in rows:
                    host = s.get(HostRow, row.host_id)
                    give_back(s, row.host_id, row.host_epoch, row.millicpus, row.memory_mb)
                    s.delete(row)
                    taken.append((row.id, row.host_id, host.link_address if host else None))
            return taken

        reaped = []
        for sandbox_id, host_id, address in await self.store.run(claim):
            reaped.append((sandbox_id, host_id))
            if address is None:
                continue
            try:
                await self.links.client(host_id, address).destroy(sandbox_id, "ttl", "system")
            except (LinkError, LinkAnswer) as exc:  # gone there, or unreachable: its heartbeat
                log.info("sandbox %s reaped; its host %s said: %s", sandbox_id, host_id, exc)
        return reaped

    def lost(self, sandbox_ids: set[str]) -> dict[str, str]:
        """(Blocking.) Of `sandbox_ids`, those lost with their host, and why."""
        if not sandbox_ids:
            return {}
        with self.store.session() as s:
            why = values_where(
                s, SandboxRow.id, SandboxRow.lost_reason, sandbox_ids, SandboxRow.state == "lost"
            )
        return {i: reason or "its host was lost" for i, reason in why.items()}
