"""The Firecracker driver's snapshots: `snapshot` pauses a microVM and writes its state, memory
and scratch disk; `restore` starts a fresh Firecracker from them in a new state directory.

`Snapshots` is a part of `FirecrackerDriver` (`firecracker.py`), moved here unchanged: its
methods use the driver's assets, VM root, launch, API and teardown.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from aamp.sandbox import driver_record
from aamp.sandbox.driver import SANDBOX_ID_RE, DriverError, SandboxHandle
from aamp.sandbox.firecracker_api import FirecrackerApi
from aamp.sandbox.firecracker_files import place, sparse_copy
from aamp.sandbox.firecracker_jail import JailerConfig
from aamp.sandbox.firecracker_procs import is_our_vm

# Each sandbox's record in its state directory, for destroy and reap.
RECORD = "firecracker.json"


def check_id(sandbox_id: str) -> None:
    if not SANDBOX_ID_RE.match(sandbox_id):
        raise DriverError(f"bad sandbox id {sandbox_id!r} (expected sb- and 12 hex digits)")


class Snapshots:
    """Snapshot and restore of the driver's microVMs."""

    name: str
    jailer: JailerConfig | None

    # the driver's
    _assets: Callable[[], Awaitable[tuple[object, object]]]
    _hold_image: Callable[[str, Path], Awaitable[None]]
    _prepare: Callable[..., Path]
    _place_files: Callable[..., None]
    _launch: Callable[..., Awaitable[None]]
    _api: Callable[[SandboxHandle], FirecrackerApi]
    _observe: Callable[[FirecrackerApi], Awaitable[None]]
    _teardown: Callable[..., Awaitable[None]]

    async def restore(self, sandbox_id: str, snapshot: Path, state_dir: Path) -> SandboxHandle:
        """Start a fresh Firecracker in `state_dir` from a snapshot made by `snapshot()`.
        The guest resumes where it was paused; its vsock connections were reset, so the guest
        agent dials the (new) channel again."""
        check_id(sandbox_id)
        meta_path = snapshot / "snapshot.json"
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            raise DriverError(f"{snapshot} is not a Firecracker snapshot ({exc})") from None
        for name in ("vmstate", "mem", "scratch.ext4"):
            if not (snapshot / name).is_file():
                raise DriverError(f"snapshot {snapshot} lacks {name}")
        if not state_dir.is_dir():
            raise DriverError(f"state directory {state_dir} does not exist")
        binaries, kernel = await self._assets()
        handle = SandboxHandle(sandbox_id, self.name, state_dir)
        try:
            image = Path(meta["image"])
            await self._hold_image(sandbox_id, image.parent)
            vm = self._prepare(handle, binaries, int(meta["memory_bytes"]), meta["cpus"], image)
            await asyncio.to_thread(self._place_files, handle, vm, image, kernel)
            await asyncio.to_thread(sparse_copy, snapshot / "scratch.ext4", vm / "scratch.ext4")
            await asyncio.to_thread(place, bool(self.jailer), snapshot / "vmstate", vm / "vmstate")
            await asyncio.to_thread(place, bool(self.jailer), snapshot / "mem", vm / "mem")
            if self.jailer:
                os.chown(vm / "scratch.ext4", self.jailer.uid, self.jailer.gid)
            await self._launch(handle, binaries, vm)
            async with self._api(handle) as api:
                await self._observe(api)
                await api.call(
                    "PUT",
                    "/snapshot/load",
                    {
                        "snapshot_path": "vmstate",
                        "mem_backend": {"backend_type": "File", "backend_path": "mem"},
                        "resume_vm": True,
                    },
                )
                handle.details["timings"] = dict(api.timings)
        except BaseException:
            await self._teardown(handle, remove_state_dir=False)
            raise
        return handle

    async def snapshot(self, handle: SandboxHandle, dest: Path) -> Path:
        """Pause, write a Full snapshot (vmstate + guest memory) plus a copy of the scratch disk
        taken while paused (so disk and memory agree), and resume whatever happens."""
        record = driver_record.read(handle.state_dir, RECORD)
        if record is None or not is_our_vm(record):
            raise DriverError(f"sandbox {handle.sandbox_id} has no running Firecracker")
        vm = Path(record["vm_root"])
        dest.mkdir(parents=True, exist_ok=True)
        work = vm / "snapshot-tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        if self.jailer or record.get("jailed"):
            os.chown(work, int(record["uid"]), int(record["gid"]))
        async with self._api(handle) as api:
            await api.call("PATCH", "/vm", {"state": "Paused"})
            try:
                await api.call(
                    "PUT",
                    "/snapshot/create",
                    {
                        "snapshot_type": "Full",
                        "snapshot_path": "snapshot-tmp/vmstate",
                        "mem_file_path": "snapshot-tmp/mem",
                    },
                )
                await asyncio.to_thread(sparse_copy, vm / "scratch.ext4", dest / "scratch.ext4")
            finally:
                await api.call("PATCH", "/vm", {"state": "Resumed"})
            handle.details["snapshot_timings"] = dict(api.timings)
        for name in ("vmstate", "mem"):
            await asyncio.to_thread(shutil.move, str(work / name), str(dest / name))
        shutil.rmtree(work, ignore_errors=True)
        meta = {
            "image": record["image"],
            "memory_bytes": record["memory_bytes"],
            "cpus": record["cpus"],
            "firecracker": "1.12.1",
            "from_sandbox": handle.sandbox_id,
        }
        (dest / "snapshot.json").write_text(json.dumps(meta, indent=2))
        return dest
