"""The manager's warm pools: a sandbox taken from one (booted exactly as the request's boot
key says, never used), pools filled behind it and drained when no longer wanted.

`WarmPools` is a part of `SandboxManager` (`manager.py`), moved here unchanged: its methods use
the manager's images, boot and teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aamp.sandbox.channel.errors import ChannelError
from aamp.sandbox.driver import Driver, DriverError
from aamp.sandbox.images import ImageBuildError, ImageStore
from aamp.sandbox.live import Sandbox
from aamp.sandbox.requests import SandboxError
from aamp.sandbox.warm_pool import BootKey, PoolTargets

# A pool's sandboxes boot at a low CPU weight (`SandboxSpec.background`: its gofer, gVisor
# kernel and guest agent, ~90% of a boot's CPU, yield to every sandbox in use, and it gets the
# normal weight at hand-out). What stays at normal weight is the boot's start on the host
# (`runsc run` itself, ~40 ms of CPU, and the manager's part in this process): the refill
# starts this long after a hand-out, so that it does not run beside the handed-out sandbox's
# first command, and no longer, so that the pool is full again for the next create soon.
REFILL_DELAY = 0.1

log = logging.getLogger("aamp.sandbox")


class WarmPools:
    """Warm pools of pre-started sandboxes, by boot key (`warm_pool.py`)."""

    images: ImageStore
    drivers: dict[str, Driver]
    default_driver: str
    pool_targets: PoolTargets
    _pools: dict[BootKey, list[Sandbox]]
    _pool_fill: dict[BootKey, asyncio.Task[None]]

    _boot: Callable[..., Awaitable[Sandbox]]  # the manager's: a sandbox booted cold
    _teardown: Callable[..., Awaitable[None]]

    async def _take_from_pool(self, key: BootKey, image_hash: str) -> Sandbox | None:
        """A warm sandbox booted exactly as `key` says, never used, or None (then booted
        cold); the pool is refilled behind it, and the key learned (`PoolTargets`)."""
        for dropped in self.pool_targets.requested(key):
            await self._drain(dropped)
        pool = self._pools.get(key) or []
        taken: Sandbox | None = None
        while pool and taken is None:
            sandbox = pool.pop(0)
            if sandbox.image_hash != image_hash or not sandbox.channel.connected:
                # Awaited, not left to a loose task: shutdown must never miss one.
                await self._teardown(sandbox, reason="stale")
                continue
            try:  # it booted at a low CPU weight; from now on it is in use
                self.drivers[sandbox.driver].foreground(sandbox.handle)
            except DriverError as exc:
                log.warning("warm sandbox %s not handed out: %s", sandbox.id, exc)
                await self._teardown(sandbox, reason="its CPU weight could not be raised")
                continue
            taken = sandbox
            taken.warm = True
        if self.pool_targets.target(key):
            self._refill_pool(key, delay=REFILL_DELAY if taken is not None else 0.0)
        return taken

    async def _drain(self, key: BootKey) -> None:
        """Stop keeping `key` warm: its filling stops, its unused sandboxes go."""
        task = self._pool_fill.pop(key, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for sandbox in self._pools.pop(key, []):
            await self._teardown(sandbox, reason="pool no longer wanted")

    def _refill_pool(self, key: BootKey, *, delay: float = 0.0) -> None:
        running = self._pool_fill.get(key)
        if running is not None and not running.done():
            return
        self._pool_fill[key] = asyncio.get_running_loop().create_task(
            self._fill(key, delay), name=f"pool-{key.image}"
        )

    async def _fill(self, key: BootKey, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        pool = self._pools.setdefault(key, [])
        while len(pool) < self.pool_targets.target(key):
            try:
                image = self.images.get(key.image)
                if key.packages:
                    image = await asyncio.to_thread(self.images.with_packages, image, key.packages)
                # At a low CPU weight: a sandbox in use runs before a pool's boot.
                sandbox = await self._boot(key.driver, image, key.resources, background=True)
            except (SandboxError, ImageBuildError, ValueError, LookupError) as exc:
                # LookupError: not built; ValueError: the wheelhouse lacks a package
                log.warning("warm pool for %s could not start a sandbox: %s", key.image, exc)
                return
            try:
                # Pooled once its whole guest agent answers: whatever the guest still starts
                # after its first hello (gVisor's first stage starts the Python agent later)
                # is done before a hand-out, never alongside the handed-out one's commands.
                await sandbox.channel.health()
            except BaseException as exc:  # cancelled (shutdown, drain) too: nothing left over
                await self._teardown(sandbox, reason="its guest agent did not answer")
                if not isinstance(exc, ChannelError | OSError):
                    raise
                log.warning("warm pool for %s: a new sandbox did not answer: %s", key.image, exc)
                return
            sandbox.packages = key.packages
            if self._pools.get(key) is not pool:  # drained while this one booted
                await self._teardown(sandbox, reason="pool no longer wanted")
                return
            pool.append(sandbox)

    def pool_status(self) -> dict[str, int]:
        """Warm sandboxes ready, by pool (named by its image for a default-resources pool)."""
        return {key.label(self.default_driver): len(pool) for key, pool in self._pools.items()}
