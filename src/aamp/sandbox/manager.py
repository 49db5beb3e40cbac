"""The sandbox manager: the one owner of every live sandbox on this host.

It creates sandboxes (cold, or from a warm pool), hands out their guest channels, enforces
`ttl` and `idle` from the host, destroys them so that nothing remains, and on start-up reaps
whatever an earlier host process left behind. It is the single place where sandbox lifecycle
events are recorded. With a placer (`placer.py`: the fleet's placement, set by `aamp.server`)
each sandbox's host is chosen, and its capacity reserved, before it boots, and given back
when it is destroyed. A manager with no drivers runs no sandbox itself (a replica started
with `aamp up --role api`): its placer puts every one on a registered host. Its parts, each a
module of its own: what a sandbox is asked for and the errors (`requests.py`), a live sandbox
(`live.py`), the warm pools (`pool_fill.py`), a live sandbox's egress rules, events and
approver (`egress_controls.py`), sandboxes placed on other hosts (`other_hosts.py`), events
to the process log (`log_sinks.py`).

Usage::

    manager = SandboxManager(settings, images, {"gvisor": GVisorDriver(...)}, "gvisor")
    await manager.start()                        # reaps leftovers, starts the lifetime clock
    sandbox = await manager.create(CreateRequest(image="base", ttl=600))
    async with manager.use(sandbox.id) as channel:   # counts as activity for `idle`
        result, out, err = await channel.run(["python3", "-c", "print(6*7)"])
    await manager.destroy(sandbox.id, reason="done")
    await manager.shutdown()                     # destroys everything it still holds
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

from aamp.audit import AuditSink
from aamp.config import Settings
from aamp.egress.approvals import Approver
from aamp.egress.installation import InstallationListeners
from aamp.egress.proxy import EgressContext
from aamp.egress.recent import RecentEgress
from aamp.egress.resolver import Resolver, SystemResolver
from aamp.policy import (
    Policy,
    Resources,
)
from aamp.sandbox.channel.guest_channel import GuestChannel
from aamp.sandbox.driver import (
    SANDBOX_ID_RE,
    Driver,
    DriverError,
    ReadOnlyFile,
    SandboxHandle,
    SandboxSpec,
)
from aamp.sandbox.egress_controls import EgressControls
from aamp.sandbox.images import BuiltImage, ImageBuildError, ImageStore
from aamp.sandbox.live import Sandbox
from aamp.sandbox.log_sinks import LogEgressSink, LogRecorder
from aamp.sandbox.other_hosts import OnOtherHosts
from aamp.sandbox.placer import Placer, SandboxElsewhere
from aamp.sandbox.pool_fill import WarmPools
from aamp.sandbox.requests import (
    CreateRequest,
    InvalidRequest,
    SandboxError,
    SandboxStopped,
    SandboxUnavailable,
    UnknownSandbox,
    block_everything,
)
from aamp.sandbox.runtime_dir import RuntimeDir, RuntimeDirBusy
from aamp.sandbox.warm_pool import DEFAULT_MAX_WARM, BootKey, PoolTargets, boot_key

log = logging.getLogger("aamp.sandbox")

GUEST_READY_TIMEOUT = 30.0


class SandboxManager(WarmPools, EgressControls, OnOtherHosts):
    def __init__(
        self,
        settings: Settings,
        images: ImageStore,
        drivers: dict[str, Driver],
        default_driver: str,
        *,
        recorder: AuditSink | LogRecorder | None = None,
        egress: EgressContext | None = None,
        warm_pool: dict[str, int] | None = None,
        learn_pools: int = 0,
        warm_max: int = DEFAULT_MAX_WARM,
        tick: float = 0.5,
    ):
        """`warm_pool` keeps IMAGE: COUNT sandboxes warm (default driver and resources);
        `learn_pools` keeps one warm for each of that many recently requested other boot keys
        `warm_max` bounds `warm_pool`'s and the policies' (`keep_warm`) together (see
        `warm_pool.py`). `egress` is what every sandbox's proxy shares (by default this
        host's resolver, the process log, no credential injection)."""
        # No drivers: this process runs no sandbox itself (`aamp up --role api`); its placer
        # puts every one on a registered host, and `default_driver` is what it asks them for.
        if drivers and default_driver not in drivers:
            raise ValueError(f"default driver {default_driver!r} is not among {sorted(drivers)}")
        self.settings = settings
        self.images = images
        self.drivers = drivers
        self.default_driver = default_driver
        self.recorder = recorder or LogRecorder()
        egress = egress or EgressContext(SystemResolver(), LogEgressSink())
        # Every egress event passes through here to the ledger; tools that explain refusals
        # (the browser) read a sandbox's latest ones back (`egress_view`).
        self.recent_egress = RecentEgress(egress.sink)
        self.egress = dataclasses.replace(
            egress,
            sink=self.recent_egress,
            # What this installation serves (its API, announced listeners): no sandbox
            # reaches it.
            listeners=(
                egress.listeners
                if egress.listeners is not None
                else InstallationListeners.of(settings)
            ),
        )
        self.pool_targets = PoolTargets(
            {
                boot_key(default_driver, image, Resources()): size
                for image, size in (warm_pool or {}).items()
            },
            learn_pools,
            warm_max,
        )
        self.tick = tick
        self._sandboxes: dict[str, Sandbox] = {}
        # Destroyed but still being torn down: listed (they are still on the host), not usable.
        self._stopping: dict[str, Sandbox] = {}
        self._pools: dict[BootKey, list[Sandbox]] = {}
        self._pool_fill: dict[BootKey, asyncio.Task[None]] = {}
        self._lifetime_task: asyncio.Task[None] | None = None
        self._runtime: RuntimeDir | None = None
        # Where new sandboxes may go (`placer.py`); set by `aamp.server` for the fleet.
        self.placer: Placer | None = None
        # Sandboxes this process made on other hosts (they have no egress proxy here).
        self._elsewhere: set[str] = set()
        # Who answers the `default: ask` questions of those of them a run here drives (their
        # hosts ask over the link: `aamp.fleet.collector`).
        self._remote_approvers: dict[str, Approver] = {}

    @property
    def resolver(self) -> Resolver:
        """How names resolve for every sandbox's proxy (and a run's model endpoint)."""
        return self.egress.resolver

    @resolver.setter
    def resolver(self, resolver: Resolver) -> None:
        self.egress.resolver = resolver

    # -- lifecycle of the manager itself ---------------------------------------------------

    async def start(self) -> None:
        """Take the installation's runtime lock, reap leftovers, start the lifetime clock."""
        if not self.drivers:  # it runs no sandbox here: nothing to claim or reap
            return
        rt = self.settings.runtime_dir
        try:
            self._runtime = RuntimeDir.claim(rt)
        except RuntimeDirBusy:
            raise SandboxError(
                f"another aamp process already runs sandboxes for this installation "
                f"({self.settings.home}); stop it first"
            ) from None
        (rt / "sb").mkdir(exist_ok=True, mode=0o700)
        await self._reap("left behind by an earlier host process")
        self._lifetime_task = asyncio.create_task(self._lifetime_loop(), name="sandbox-lifetime")
        for key in self.pool_targets.wanted():
            self._refill_pool(key)

    async def shutdown(self) -> None:
        if self._lifetime_task:
            self._lifetime_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lifetime_task
        for task in self._pool_fill.values():
            task.cancel()
        for task in self._pool_fill.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for pool in self._pools.values():
            while pool:
                await self._teardown(pool.pop(), reason="shutdown")
        for sandbox_id in list(self._sandboxes):
            await self.destroy(sandbox_id, reason="shutdown")
        if self._runtime is not None:
            # What the drivers keep per installation (runsc's root, cgroup parents) goes too,
            # and whatever a failed destroy left is reaped now rather than at the next start.
            await self._reap("left behind by a failed destroy")
            self._runtime.release()
            self._runtime = None

    async def _reap(self, why: str) -> None:
        rt = self.settings.runtime_dir
        for driver in self.drivers.values():
            for sandbox_id in await driver.reap(rt):
                await self.recorder.record(
                    actor="system",
                    action="sandbox.reap",
                    resource=f"sandbox:{sandbox_id}",
                    decision="info",
                    reason=why,
                    details={"driver": driver.name},
                )
        # A state dir no driver claimed never got a process: remove it.
        if (rt / "sb").is_dir():
            for leftover in (rt / "sb").iterdir():
                shutil.rmtree(leftover, ignore_errors=True)

    # -- sandboxes -------------------------------------------------------------------------

    def list(self) -> list[Sandbox]:
        every = [*self._sandboxes.values(), *self._stopping.values()]
        return sorted(every, key=lambda s: s.created_at)

    def get(self, sandbox_id: str) -> Sandbox:
        sandbox = self._sandboxes.get(sandbox_id) if SANDBOX_ID_RE.match(sandbox_id) else None
        if sandbox is None:
            raise UnknownSandbox(f"no sandbox {sandbox_id!r} on this host")
        return sandbox

    async def find(self, sandbox_id: str) -> Sandbox | SandboxElsewhere:
        """A live sandbox here, or on another host (through the placer); else `UnknownSandbox`."""
        sandbox = self._sandboxes.get(sandbox_id) if SANDBOX_ID_RE.match(sandbox_id) else None
        if sandbox is not None:
            return sandbox
        if self.placer is None or not SANDBOX_ID_RE.match(sandbox_id):
            raise UnknownSandbox(f"no sandbox {sandbox_id!r} on this host")
        return await self.placer.find(sandbox_id)

    async def list_everywhere(self) -> list[Sandbox | SandboxElsewhere]:
        """Every live sandbox: this host's and (through the placer) other hosts'."""
        elsewhere = await self.placer.elsewhere() if self.placer is not None else []
        return [*self.list(), *elsewhere]

    def can_mount_files(self, driver: str | None = None) -> bool:
        """Whether sandboxes of `driver` (default: this host's) can have `read_only_files`;
        in a process that runs none itself, whether that driver can on the hosts (the files
        are sent to the host the sandbox is placed on: `aamp.fleet.host_files`)."""
        name = driver or self.default_driver
        if not self.drivers:
            from aamp.sandbox.drivers import driver_mounts_files

            return driver_mounts_files(name)
        found = self.drivers.get(name)
        return found is not None and found.mounts_files

    async def create(
        self,
        request: CreateRequest,
        *,
        actor: str = "system",
        placed_on: str | None = None,
        wheels: list[tuple[Path, str]] | None = None,
    ) -> Sandbox | SandboxElsewhere:
        """A new sandbox, placed by this manager's placer — or, with `placed_on`, one another
        replica already placed on this host (`placed_on`, its id) and sent over the host's
        link: booted here, recorded by that replica, given back when destroyed here; its
        packages' `wheels` ((file, sha256) each) are the ones that replica sent
        (`received_wheels.py`), not this machine's wheelhouse."""
        driver_name = request.driver or self.default_driver
        # Named from here on: placement reserves on a host with this driver, and a host it is
        # sent to over the link must boot it with this one, not with its own default.
        request = dataclasses.replace(request, driver=driver_name)
        if not self.drivers:  # runs none here: the host it is placed on checks driver and image
            return await self._create_elsewhere(driver_name, request, actor)
        if driver_name not in self.drivers:
            raise InvalidRequest(
                f"unknown driver {driver_name!r}; this host has {', '.join(sorted(self.drivers))}"
            )
        if request.read_only_files and not self.drivers[driver_name].mounts_files:
            raise InvalidRequest(
                f"the {driver_name} driver cannot show host files read-only in a sandbox"
            )
        try:
            image = self.images.get(request.image)
        except (ValueError, LookupError) as exc:  # UnknownImage, ImageNotBuilt
            raise InvalidRequest(str(exc)) from None
        placer = self.placer if placed_on is None else None
        reservation = await placer.reserve(driver_name, request) if placer else None
        if placer is not None:
            remote = await self._boot_elsewhere(placer, reservation, request, actor)
            if remote is not None:
                return remote
        try:  # its packages layer: built here only once the sandbox is placed here
            image = await self._packaged(image, request.packages, wheels)
        except BaseException:
            if placer is not None:
                await placer.cancel(reservation)
            raise
        sandbox = None
        try:
            if not request.read_only_files:  # the pool (files are bound in at boot)
                key = boot_key(driver_name, request.image, request.resources, request.packages)
                sandbox = await self._take_from_pool(key, image.content_hash)
            if sandbox is None:
                sandbox = await self._boot(
                    driver_name, image, request.resources, request.read_only_files
                )
            sandbox.packages = request.packages
            sandbox.host = placed_on
            if placer is not None:
                sandbox.host = await placer.placed(reservation, sandbox.id, request.ttl)
        except BaseException:
            if sandbox is not None:
                with contextlib.suppress(Exception):
                    await self._teardown(sandbox, reason="placement failed")
            if placer is not None:
                await placer.cancel(reservation)
            raise
        sandbox.egress.update_rules(request.egress)
        sandbox.egress.update_services(request.services)
        sandbox.ttl, sandbox.idle = request.ttl, request.idle
        sandbox.created_at, sandbox.started_monotonic = time.time(), time.monotonic()
        sandbox.last_used = time.monotonic()
        self._sandboxes[sandbox.id] = sandbox
        await self._record_created(sandbox, actor)
        return sandbox

    async def _packaged(
        self, image: BuiltImage, packages: tuple[str, ...], wheels: list[tuple[Path, str]] | None
    ) -> BuiltImage:
        """`image` with its packages layer (from `wheels` if given, else the wheelhouse)."""
        if not packages:
            return image
        try:
            if wheels is None:
                return await asyncio.to_thread(self.images.with_packages, image, packages)
            return await asyncio.to_thread(self.images.with_wheels, image, packages, wheels)
        except (ValueError, LookupError) as exc:  # WheelhouseError
            raise InvalidRequest(str(exc)) from None
        except ImageBuildError as exc:
            raise SandboxUnavailable(f"the image with packages could not be built: {exc}") from None

    async def _record_destroyed(
        self, sandbox_id: str, reason: str, actor: str, details: dict[str, object] | None = None
    ) -> None:
        await self._record(sandbox_id, "sandbox.destroy", "info", reason, actor, details)

    async def _record(
        self,
        sandbox_id: str,
        action: str,
        decision: str,
        reason: str,
        actor: str,
        details: dict[str, object] | None = None,
    ) -> None:
        await self.recorder.record(
            actor=actor,
            action=action,
            resource=f"sandbox:{sandbox_id}",
            decision=decision,  # type: ignore[arg-type]
            reason=reason,
            **({"details": details} if details is not None else {}),  # type: ignore[typeddict-item]
        )

    async def _record_created(self, sandbox: Sandbox | SandboxElsewhere, actor: str) -> None:
        await self.recorder.record(
            actor=actor,
            action="sandbox.create",
            resource=f"sandbox:{sandbox.id}",
            decision="info",
            details=sandbox.describe(),
        )

    @contextlib.asynccontextmanager
    async def use(self, sandbox_id: str) -> AsyncIterator[GuestChannel]:
        """Borrow a sandbox's channel; while borrowed the sandbox is not idle. A sandbox on
        another host is reached through its link (its host keeps its clock)."""
        if sandbox_id not in self._sandboxes and self.placer is not None:
            remote = await self.find(sandbox_id)
            if not isinstance(remote, Sandbox):
                yield remote.link.channel(sandbox_id)
                return
        sandbox = self.get(sandbox_id)
        await self._check_alive(sandbox)
        sandbox.active_uses += 1
        try:
            yield sandbox.channel
        finally:
            sandbox.active_uses -= 1
            sandbox.last_used = time.monotonic()

    async def destroy(
        self, sandbox_id: str, *, reason: str = "requested", actor: str = "system"
    ) -> None:
        if sandbox_id not in self._sandboxes and self.placer is not None:
            host = await self.placer.destroy_elsewhere(sandbox_id, reason, actor)
            if host is not None:
                self._elsewhere.discard(sandbox_id)
                self._remote_approvers.pop(sandbox_id, None)
                await self._record_destroyed(sandbox_id, reason, actor, {"host": host})
                return
        sandbox = self.get(sandbox_id)
        del self._sandboxes[sandbox_id]
        # Listed until its teardown is done and recorded (the driver's removal runs off the
        # event loop): a sandbox gone from `list` has left nothing behind.
        self._stopping[sandbox_id] = sandbox
        try:
            await self._teardown(sandbox, reason=reason)
            await self._record_destroyed(sandbox_id, reason, actor)
        finally:
            del self._stopping[sandbox_id]
            if self.placer is not None and sandbox.host is not None:
                await self.placer.release(sandbox_id)

    async def _check_alive(self, sandbox: Sandbox) -> None:
        """A guest that stopped by itself is destroyed at once, and the caller told why."""
        if sandbox.channel.connected:
            return
        why = self.drivers[sandbox.driver].exited(sandbox.handle)
        if why is None:
            return
        if sandbox.id in self._sandboxes:
            await self.destroy(sandbox.id, reason=f"stopped: {why}")
        raise SandboxStopped(f"sandbox {sandbox.id} has stopped: {why}")

    async def _boot(
        self,
        driver_name: str,
        image: BuiltImage,
        resources: Resources,
        read_only_files: tuple[ReadOnlyFile, ...] = (),
        *,
        background: bool = False,
    ) -> Sandbox:
        """A sandbox booted cold, its guest agent connected; `background`: ahead of any
        request, at a low CPU weight (`SandboxSpec.background`)."""
        driver = self.drivers[driver_name]
        image_name = image.name
        sandbox_id = f"sb-{secrets.token_hex(6)}"
        state_dir = self.settings.runtime_dir / "sb" / sandbox_id
        state_dir.mkdir(mode=0o700)
        channel_path = driver.channel_path(state_dir)
        channel_path.parent.mkdir(parents=True, exist_ok=True)
        channel = GuestChannel(channel_path, max_file_bytes=self.settings.max_file_bytes)
        # Until a request's own rules replace them, a booting sandbox may reach nothing.
        egress = self.egress.proxy(sandbox_id, driver.egress_path(state_dir), block_everything())
        handle: SandboxHandle | None = None
        try:
            await channel.start()
            await egress.start()
            spec = SandboxSpec(
                image=image_name,
                resources=resources,
                read_only_files=read_only_files,
                background=background,
            )
            handle = await driver.create(sandbox_id, spec, image, state_dir)
            await channel.wait_ready(GUEST_READY_TIMEOUT)
        except BaseException as exc:
            await channel.close()
            await egress.close()
            if handle is not None:
                await driver.destroy(handle)
            shutil.rmtree(state_dir, ignore_errors=True)
            if isinstance(exc, DriverError | TimeoutError | OSError):
                raise SandboxUnavailable(f"could not start a {driver_name} sandbox: {exc}") from exc
            raise
        return Sandbox(
            id=sandbox_id,
            image=image_name,
            image_hash=image.content_hash,
            driver=driver_name,
            resources=resources,
            handle=handle,
            channel=channel,
            egress=egress,
        )

    async def _teardown(self, sandbox: Sandbox, *, reason: str) -> None:
        await sandbox.channel.close()
        await self.drivers[sandbox.driver].destroy(sandbox.handle)
        await sandbox.egress.close()  # after the guest is gone: its ledger events are flushed
        self.recent_egress.forget(sandbox.id)
        log.debug("sandbox %s destroyed (%s)", sandbox.id, reason)

    # -- warm pool -------------------------------------------------------------------------

    async def keep_warm(self, name: str, policy: Policy | None) -> None:
        """Keep the stored policy `name`'s `warm` sandboxes ready, booted as its sandboxes
        are (None: it was deleted); a pool it no longer needs goes, unused sandboxes beyond
        a lowered target are destroyed."""
        key = None
        if policy is not None:
            key = boot_key(self.default_driver, policy.image, policy.resources, policy.packages)
        for changed in self.pool_targets.keep(name, key, policy.warm if policy else 0):
            target = self.pool_targets.target(changed)
            if not target:
                await self._drain(changed)
                continue
            pool = self._pools.get(changed, [])
            while len(pool) > target:
                await self._teardown(pool.pop(), reason="pool made smaller")
            if self._lifetime_task is not None:  # started: fill now (else `start` does)
                self._refill_pool(changed)

    # -- the host's clock ------------------------------------------------------------------

    async def _lifetime_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            now = time.monotonic()
            for sandbox in list(self._sandboxes.values()):
                if sandbox.id not in self._sandboxes:
                    continue
                try:
                    reason = sandbox.expiry_reason(now)
                    if reason:
                        await self.destroy(sandbox.id, reason=reason)
                    else:
                        await self._check_alive(sandbox)
                except SandboxStopped:
                    pass  # destroyed and recorded by _check_alive
                except Exception:  # keep the clock running whatever one teardown does
                    log.exception("lifetime check of sandbox %s failed", sandbox.id)
