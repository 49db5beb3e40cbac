"""The isolation-driver contract: the one cut between "a sandbox" and "how it is isolated".

A driver turns a `SandboxSpec` plus a built image into a running guest whose guest agent has
dialled the host end of its channel, and later removes every trace of it. Everything that
happens *inside* a running sandbox (exec, put, get, health) goes through the channel
(`aamp.sandbox.GuestChannel`), which is the same for every driver; so the rest of the
code never asks which driver it holds.

Usage::

    driver = GVisorDriver(settings)
    sock = driver.channel_path(state_dir)            # the host listens here first
    proxy = driver.egress_path(state_dir)            # and its egress proxy here
    handle = await driver.create("sb-0123456789ab", spec, image, state_dir)
    ...                                   # channel.exec(...), channel.put(...)
    await driver.destroy(handle)          # idempotent; leaves no process, mount, dir, socket

Contract:
- `create` returns only once the guest is running; the caller then waits for the guest agent
  on the channel. On failure it cleans up what it made and raises `DriverError`.
- `destroy` is idempotent and never raises for "already gone".
- `reap(runtime_dir)` removes everything an earlier host process left behind (after a crash):
  it must work from on-disk state alone.
- `snapshot` may raise `SnapshotUnsupported`.
- `exited(handle)` tells, cheaply, whether a guest stopped by itself and why.
- a spec marked `background` (booted ahead of any request, for a warm pool) runs at the
  host's background CPU weight, so its boot yields to every sandbox in use;
  `foreground(handle)` gives it the weight of every other sandbox when it is handed out. A
  driver that cannot weight its guests boots them all alike and has nothing to do there.
- `probe()` says whether the driver can work on this host, in plain words.
- `mounts_files` says whether the driver can show a host file to the guest read-only (a spec's
  `read_only_files`); one that cannot refuses such a spec in `create` (`DriverError`), so
  a caller that wants one must ask first and choose another way itself, in the open.

A spec's `resources` are the policy's own value (`aamp.policy.Resources`), bounds included.
"""

from __future__ import annotations

import abc
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aamp.policy.resources import Resources

if TYPE_CHECKING:
    from aamp.sandbox.images import BuiltImage

SANDBOX_ID_RE = re.compile(r"^sb-[0-9a-f]{12}\Z")
# Where a read-only file may appear in a guest: under the workspace, never over a path the
# guest agent, the channel or the kernel's own file systems live at.
READ_ONLY_FILE_ROOT = "/workspace/"


class DriverError(RuntimeError):
    """The driver could not do what was asked; the message says why in plain words."""


class SnapshotUnsupported(DriverError):
    pass


@dataclass(frozen=True)
class ReadOnlyFile:
    """A host file the guest sees at `target`, read-only: the guest can read it and can neither
    write, truncate, rename nor remove it, and the host file never changes."""

    source: Path
    target: str

    def __post_init__(self) -> None:
        target = self.target
        if (
            not target.startswith(READ_ONLY_FILE_ROOT)
            or posixpath.normpath(target) != target
            or not re.fullmatch(r"[A-Za-z0-9._/-]{1,255}", target)
        ):
            raise ValueError(
                f"a read-only file's place in the guest must be a plain path under "
                f"{READ_ONLY_FILE_ROOT}, not {target!r}"
            )
        if self.source.is_symlink() or not self.source.is_file():
            raise ValueError(f"{self.source} is not a regular file of the host")


@dataclass(frozen=True)
class SandboxSpec:
    image: str = "base"
    resources: Resources = field(default_factory=Resources)
    # Environment every exec starts from (the egress issue adds the proxy variables here).
    env: dict[str, str] = field(default_factory=dict)
    # Host files shown read-only in the guest (only drivers whose `mounts_files` is true).
    read_only_files: tuple[ReadOnlyFile, ...] = ()
    # Booted ahead of any request (a warm pool's): a low CPU weight until `foreground`.
    background: bool = False


@dataclass(frozen=True)
class DriverStatus:
    name: str
    usable: bool
    reason: str  # plain words: why it works, or why not and what to do


@dataclass
class SandboxHandle:
    """What a driver needs to find and destroy one sandbox. Kept in memory by the manager;
    drivers also keep enough on disk under `state_dir` for `reap` to work after a crash."""

    sandbox_id: str
    driver: str
    state_dir: Path
    pid: int | None = None
    details: dict[str, object] = field(default_factory=dict)


class Driver(abc.ABC):
    name: str
    # Whether `create` can bind a spec's `read_only_files` into the guest.
    mounts_files: bool = False

    @abc.abstractmethod
    def probe(self) -> DriverStatus: ...

    @abc.abstractmethod
    def channel_path(self, state_dir: Path) -> Path:
        """Where, under this sandbox's `state_dir`, the host must listen for its guest agent
        (gVisor binds that socket's directory into the guest; Firecracker's vsock device
        forwards guest connections to it)."""

    @abc.abstractmethod
    def egress_path(self, state_dir: Path) -> Path:
        """Where, under `state_dir`, the host's egress proxy for this sandbox listens; the
        guest agent's forwarder on 127.0.0.1:3128 carries every connection there."""

    @abc.abstractmethod
    async def create(
        self, sandbox_id: str, spec: SandboxSpec, image: BuiltImage, state_dir: Path
    ) -> SandboxHandle:
        """Start a guest from `image` whose guest agent will dial `channel_path(state_dir)`,
        on which the host already listens. `state_dir` exists and belongs to this sandbox."""

    @abc.abstractmethod
    def exited(self, handle: SandboxHandle) -> str | None:
        """None while the guest runs; once it has stopped by itself (out of memory, process
        limit, crash), plain words saying why as far as the host can tell."""

    @abc.abstractmethod
    async def destroy(self, handle: SandboxHandle) -> None: ...

    def foreground(self, handle: SandboxHandle) -> None:
        """Give a sandbox booted `background` the CPU weight every other sandbox has (it is
        being handed out); `DriverError` if it cannot. Quick: it runs on the event loop."""
        return None  # a driver that boots every sandbox alike

    @abc.abstractmethod
    async def reap(self, runtime_dir: Path) -> list[str]:
        """Remove leftovers of sandboxes no live host process owns; return their ids."""

    async def snapshot(self, handle: SandboxHandle, dest: Path) -> Path:
        raise SnapshotUnsupported(f"the {self.name} driver cannot snapshot a sandbox")
