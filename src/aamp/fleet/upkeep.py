"""`FleetUpkeep`: each replica's one fleet task — heartbeat the host this process runs (if any)
and mark lost the hosts whose heartbeats stopped.

`aamp up` on one machine runs its own sandbox host in the same process: `LocalHost` registers
it (host id `local` by default, `AAMP_FLEET_HOST_ID`) with the same `HostRegistry.register` a
remote host's request reaches, under a token made at start-up and kept only in memory — with
its link's address when it serves one (`local_link.py`, `AAMP_FLEET_LINK_LISTEN`), so that
other replicas reach its sandboxes. Its heartbeat is taken in the same tick, just before the
lost-host sweep, so a busy event loop delays both alike and never makes a replica mark its own
host lost. Each host marked lost is audited (`host.lost`, actor `system`). Then, at every tick,
every `after_sweep` callback runs (the run service fails the runs it drives whose sandboxes
were lost, a cheap look-up of its own runs' sandboxes): every tick, not only when this replica
marked a host, so a replica learns of a host another replica marked lost within one heartbeat
instead of at its next lease renewal.

A local host that was marked lost meanwhile (this process stalled longer than the lost timeout)
has its heartbeat refused with `StaleEpoch`: it destroys every sandbox it still runs — they are
lost to everyone else already — and registers again, as a new life, before it takes new work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aamp.audit import AuditSink
from aamp.errors import AampError, NotFound
from aamp.fleet.local_link import LocalLink
from aamp.fleet.registry import MAX_IMAGES, HostFacts, HostInfo, HostRegistry, StaleEpoch
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import SandboxManager

log = logging.getLogger("aamp.fleet")
# A host's default sandbox slots: one per this much memory (placement counts them).
MEMORY_MB_PER_SANDBOX = 256
# A sandbox's `cpus` is a ceiling (a cgroup quota), not a core set aside, so a host offers
# this many sandbox cpus per core: one busy sandbox per core still has a core, and a 2-core
# machine runs more than two idle-most-of-the-time sandboxes, as it did before placement.
CPUS_PER_CORE = 4


def images_present(images: ImageStore) -> tuple[str, ...]:
    """`NAME@CONTENT_HASH` of every image built on this machine, then the packages layers
    over them (`NAME+KEY@HASH`, `ImageStore.layers`) — as many as a report holds, the
    images first (a layer missing from the report is only not preferred)."""
    built = sorted(f"{i.name}@{i.content_hash}" for i in images.list())
    return tuple(built + sorted(images.layers()))[:MAX_IMAGES]


def machine_facts(manager: SandboxManager) -> HostFacts:
    """What this machine offers as a sandbox host."""
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return HostFacts(
        drivers=tuple(sorted(manager.drivers)),
        cpus=(os.cpu_count() or 1) * CPUS_PER_CORE,
        memory_mb=memory_mb,
        sandboxes=max(1, memory_mb // MEMORY_MB_PER_SANDBOX),
        images=images_present(manager.images),
    )


@dataclass
class LocalHost:
    """The sandbox host in this process: its id, its in-memory token, current epoch and that
    epoch's heartbeat secret."""

    registry: HostRegistry
    manager: SandboxManager
    host_id: str
    token: str = ""
    epoch: int = 0
    heartbeat_secret: str = ""
    # Its link, for other replicas (`local_link.py`; None: only this process reaches it).
    link: LocalLink | None = None

    def register(self) -> HostInfo:
        """(Blocking.) Make sure the host row exists with a fresh token, then register."""
        try:
            self.registry.get(self.host_id)
            self.token = self.registry.new_token(self.host_id)
        except NotFound:  # not there yet: add it
            _, self.token = self.registry.add(self.host_id, by="system")
        info, self.heartbeat_secret = self.registry.register(
            self.host_id,
            self.token,
            machine_facts(self.manager),
            self.link.address if self.link is not None else None,
        )
        self.epoch = info.epoch
        return info

    def heartbeat(self) -> HostInfo:
        return self.registry.heartbeat(
            self.host_id,
            self.token,
            self.epoch,
            self.heartbeat_secret,
            images_present(self.manager.images),
        )


class FleetUpkeep:
    def __init__(
        self,
        registry: HostRegistry,
        audit: AuditSink,
        local: LocalHost | None,
        interval: float,
    ) -> None:
        self.registry = registry
        self.audit = audit
        self.local = local
        self.interval = interval
        self.after_sweep: list[Callable[[], Awaitable[object]]] = []
        self.after_stop: list[Callable[[], Awaitable[object]]] = []  # once the clock stopped
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.local is not None:
            local = self.local
            if local.link is not None:  # serving before the address is registered
                await local.link.start(lambda: local.epoch)
            await self.registry.store.run(local.register)
        self._task = asyncio.create_task(self._loop(), name="fleet-upkeep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for callback in self.after_stop:
            await callback()
        if self.local is not None and self.local.link is not None:
            await self.local.link.stop()

    async def tick(self) -> list[HostInfo]:
        """One heartbeat of the local host and one sweep; the hosts this sweep marked lost."""
        if self.local is not None:
            try:
                await self.registry.store.run(self.local.heartbeat)
            except StaleEpoch as exc:
                await self._begin_again(self.local, str(exc))
            except AampError as exc:
                # Another process registered under the same id (each start makes a new
                # token), or this one was marked lost while stalled; the sweep still runs.
                log.error(
                    "this process's sandbox host %r was refused (%s); is another process"
                    " registered under the same AAMP_FLEET_HOST_ID?",
                    self.local.host_id,
                    exc,
                )
        lost = await self.registry.store.run(self.registry.mark_lost)
        for host in lost:
            await self.audit.record(
                actor="system",
                action="host.lost",
                resource=f"host:{host.id}",
                decision="allow",
                reason=(
                    f"no heartbeat since {host.heartbeat_at} "
                    f"(lost after {self.registry.lost_after:g} s)"
                ),
                details={"epoch": host.epoch},
            )
            log.warning("host %s marked lost (last heartbeat %s)", host.id, host.heartbeat_at)
        for callback in self.after_sweep:
            try:
                await callback()
            except Exception:  # one listener's failure must not stop the fleet's clock
                log.exception("a listener of lost hosts failed")
        return lost

    async def _begin_again(self, local: LocalHost, why: str) -> None:
        """This process's host was lost while it stalled: destroy what it still runs, then
        register a new life."""
        log.error("this process's sandbox host %r must begin again: %s", local.host_id, why)
        for sandbox in local.manager.list():
            with contextlib.suppress(AampError):
                await local.manager.destroy(
                    sandbox.id,
                    reason=f"its host {local.host_id} was marked lost; destroyed before new work",
                )
        await self.registry.store.run(local.register)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except Exception:  # keep the fleet's clock running whatever one tick does
                log.exception("fleet upkeep tick failed")
