"""The Firecracker driver: one microVM per aamp sandbox, driven over Firecracker's API socket.

Per sandbox, everything lives in its `state_dir` (the "VM root"; with the jailer, the jail's
chroot inside it), and Firecracker runs with that directory as its working directory, so every
path handed to its API is *relative*. That keeps snapshots portable: a snapshot records
"rootfs.ext4", "scratch.ext4" and "v.sock", which a restore resolves in its own new directory.

    fc.sock           API socket              firecracker.json  record for destroy/reap
    v.sock            vsock device socket     v.sock_5000       the channel (host listens)
                                              v.sock_5001       the egress proxy (host listens)
    rootfs.ext4       the image, read-only    scratch.ext4      /workspace, sparse ext4
    vmlinux, initrd   the guest kernel        metrics.json      one JSON line per flush
    firecracker.log   Firecracker's log       console.log       the guest's serial console

The guest agent dials vsock host port 5000; Firecracker forwards a guest-initiated connection
to `<uds_path>_<port>`, hence `channel_path(state_dir) = state_dir / "v.sock_5000"`.

Nothing here waits on the guest: `create` returns when Firecracker accepted InstanceStart
(every API call has a deadline), and the caller waits for the guest agent on the channel with
its own timeout. That matters on `kvm_pvm` hosts, where a stock kernel never runs: InstanceStart
still succeeds and the vCPU thread spins at 100% CPU with no exit of any kind and nothing on
the serial console, forever (see `boot_diagnosis`).

While a VM lives, this driver holds a shared lock on its image's directory
(`aamp.sandbox.images.hold_image`), so `aamp image prune` and `image build --force` never delete
the ext4 a guest boots from; teardown lets go of it.

Optional jailer (`AAMP_FIRECRACKER_JAILER_UID` / `_GID`): Firecracker then runs chrooted under
`state_dir/jail`, as that uid/gid, in its own cgroups (memory and cpu from the resources). The
image and kernel are hard-linked into the chroot when on the same filesystem, else bind-mounted
read-only; destroy unmounts them and removes the cgroups. Everything is placed *before* the
jailer starts: it pivots into its own mount namespace, which does not see later bind mounts.

No host file is ever shown to the guest as a file (`mounts_files` is false): a microVM has
block devices, not a shared file system, so a spec with `read_only_files` is refused, and a
caller that needs a file in the guest copies it into the guest's own disk, saying so (a run's
knowledge-base index: `knowledge_base.copied`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aamp.config import Settings
from aamp.policy import MiB
from aamp.sandbox import cgroups, driver_record, procs
from aamp.sandbox.driver import (
    Driver,
    DriverError,
    DriverStatus,
    SandboxHandle,
    SandboxSpec,
)
from aamp.sandbox.firecracker_api import API_SOCK, FirecrackerApi
from aamp.sandbox.firecracker_binary import (
    FirecrackerBinaries,
    binary_status,
    ensure_binaries,
)
from aamp.sandbox.firecracker_exit import exit_reason, last_line, progress_words, tail
from aamp.sandbox.firecracker_files import make_scratch, place
from aamp.sandbox.firecracker_jail import CGROUP_PARENT, JailerConfig, jailer_argv
from aamp.sandbox.firecracker_kernel import GuestKernel, ensure_guest_kernel
from aamp.sandbox.firecracker_procs import (
    is_our_vm,
    owner_alive,
    start_ticks,
    stop_pid,
    unmount_under,
    vm_pids,
)
from aamp.sandbox.firecracker_snapshot import RECORD, Snapshots, check_id
from aamp.sandbox.images import ImageUnavailable, ImageUse, hold_image_async
from aamp.sandbox.kvm import detect_kvm

if TYPE_CHECKING:
    from aamp.sandbox.images import BuiltImage

AGENT_IN_GUEST = "/opt/aamp/agent"
AGENT_ARGS = "--init --connect vsock:2:5000 --egress vsock:2:5001"
GUEST_CID = 3
CHANNEL_PORT = 5000
EGRESS_PORT = 5001
VSOCK = "v.sock"
MAX_VCPUS = 32
UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL

Progress = Callable[[str], None]


class FirecrackerDriver(Snapshots, Driver):
    name = "firecracker"

    def __init__(
        self,
        settings: Settings,
        *,
        binaries: FirecrackerBinaries | None = None,
        kernel: GuestKernel | None = None,
        jailer: JailerConfig | None = None,
        api_timeout: float = 10.0,
        start_timeout: float = 5.0,
        progress: Progress | None = None,
    ):
        self.settings = settings
        self._binaries = binaries
        self._kernel = kernel
        self.jailer = jailer if jailer is not None else JailerConfig.from_env(settings.env)
        self.api_timeout = api_timeout
        self.start_timeout = start_timeout
        self.progress = progress or (lambda _msg: None)
        # Popen objects of the VMs this instance started, so their exit status is collected.
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        # The image each live VM of this instance runs from, held until its teardown.
        self._image_uses: dict[str, ImageUse] = {}

    # -- what this host can do ------------------------------------------------------------

    def probe(self) -> DriverStatus:
        binary = binary_status(self.settings)
        kvm = detect_kvm()
        if binary[0] is None:
            return DriverStatus(self.name, False, f"{binary[1]}; {kvm.reason}")
        if not kvm.available:
            return DriverStatus(self.name, False, f"{binary[1]}; {kvm.reason}")
        if kvm.pvm:
            return DriverStatus(
                self.name,
                False,
                f"{binary[1]}; guests cannot boot here because {kvm.reason}",
            )
        return DriverStatus(self.name, True, f"{binary[1]}; {kvm.reason}")

    def channel_path(self, state_dir: Path) -> Path:
        return state_dir / f"{VSOCK}_{CHANNEL_PORT}"

    def egress_path(self, state_dir: Path) -> Path:
        return state_dir / f"{VSOCK}_{EGRESS_PORT}"

    # -- lifecycle ------------------------------------------------------------------------

    async def _assets(self) -> tuple[FirecrackerBinaries, GuestKernel]:
        if self._binaries is None:
            self._binaries = await asyncio.to_thread(ensure_binaries, self.settings, self.progress)
        if self._kernel is None:
            self._kernel = await asyncio.to_thread(
                ensure_guest_kernel, self.settings, self.progress
            )
        return self._binaries, self._kernel

    async def create(
        self, sandbox_id: str, spec: SandboxSpec, image: BuiltImage, state_dir: Path
    ) -> SandboxHandle:
        check_id(sandbox_id)
        if spec.read_only_files:
            raise DriverError(
                "the firecracker driver cannot show a host file read-only in a microVM (it has "
                "no shared file system, only block devices); copy the file in instead"
            )
        if not state_dir.is_dir():
            raise DriverError(f"state directory {state_dir} does not exist")
        ext4 = Path(image.ext4)
        if not ext4.is_file():
            raise DriverError(f"image {image.name!r} has no ext4 file at {ext4}")
        res = spec.resources
        vcpus = math.ceil(res.cpus)
        if vcpus > MAX_VCPUS:
            raise DriverError(f"resources.cpus={res.cpus}: Firecracker allows at most 32 vCPUs")
        binaries, kernel = await self._assets()
        handle = SandboxHandle(sandbox_id, self.name, state_dir)
        await self._hold_image(sandbox_id, ext4.parent)
        try:
            vm = self._prepare(handle, binaries, res.memory_bytes, res.cpus, ext4)
            await asyncio.to_thread(self._place_files, handle, vm, ext4, kernel)
            await asyncio.to_thread(make_scratch, vm / "scratch.ext4", res.disk_bytes)
            if self.jailer:
                os.chown(vm / "scratch.ext4", self.jailer.uid, self.jailer.gid)
            await self._launch(handle, binaries, vm)
            boot_args = f"console=ttyS0 reboot=k panic=1 pci=off quiet init={AGENT_IN_GUEST}"
            boot_args += f" -- {AGENT_ARGS}"
            boot: dict[str, Any] = {"kernel_image_path": "vmlinux", "boot_args": boot_args}
            if kernel.initrd is not None:
                boot["initrd_path"] = "initrd"
            async with self._api(handle) as api:
                await self._observe(api)
                await api.boot(vcpus, res.memory_bytes // MiB, boot, GUEST_CID, VSOCK)
                handle.details["timings"] = dict(api.timings)
        except BaseException:
            await self._teardown(handle, remove_state_dir=False)
            raise
        return handle

    async def metrics(self, handle: SandboxHandle) -> dict[str, Any]:
        """Ask Firecracker to flush its metrics and return that flush (counters are deltas
        since the previous flush; Firecracker also flushes on its own every 60 s)."""
        record = driver_record.read(handle.state_dir, RECORD)
        if record is None:
            raise DriverError(f"sandbox {handle.sandbox_id} has no Firecracker record")
        path = Path(record["vm_root"]) / "metrics.json"
        async with self._api(handle) as api:
            await api.call("PUT", "/actions", {"action_type": "FlushMetrics"})
        line = last_line(path)
        if not line:
            raise DriverError(f"firecracker wrote no metrics to {path}")
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    async def boot_diagnosis(self, handle: SandboxHandle) -> str:
        """Plain words on whether the guest is doing anything, for when its agent never
        called: vCPU exits and serial-console output since the last flush."""
        return progress_words(await self.metrics(handle))

    def exited(self, handle: SandboxHandle) -> str | None:
        """None while the microVM's process runs; once it stopped by itself, why: a guest
        kernel panic (the agent, PID 1, dying panics the guest; `panic=1 reboot=k` then ends
        Firecracker), a guest reboot/power-off, or firecracker killed or failing on the host."""
        child = self._children.get(handle.sandbox_id)
        record = driver_record.read(handle.state_dir, RECORD)
        if child is not None:
            code = child.poll()
            if code is None:
                return None
        elif record is not None and (is_our_vm(record) or vm_pids(record)):
            return None
        elif record is None:
            return "the microVM is gone (its state directory has no record)"
        else:
            code = None
        vm = Path(str(record["vm_root"])) if record else handle.state_dir
        return exit_reason(code, handle.state_dir / "console.log", vm / "firecracker.log")

    async def destroy(self, handle: SandboxHandle) -> None:
        await self._teardown(handle, remove_state_dir=True)

    async def reap(self, runtime_dir: Path) -> list[str]:
        """Remove every Firecracker sandbox under `runtime_dir` whose owning host process is
        gone, from the on-disk records alone; also kill stray firecracker processes whose API
        socket lies under `runtime_dir` (a crash between spawn and record)."""
        reaped: list[str] = []
        if not runtime_dir.is_dir():
            return reaped
        # State dirs sit directly under the runtime dir or one level down (the manager's sb/).
        records = [*runtime_dir.glob(f"*/{RECORD}"), *runtime_dir.glob(f"*/*/{RECORD}")]
        for record_path in sorted(records):
            record = driver_record.read(record_path.parent, RECORD)
            if record is None or owner_alive(record):
                continue
            state_dir = record_path.parent
            sandbox_id = str(record.get("sandbox_id", state_dir.name))
            await self._teardown(
                SandboxHandle(sandbox_id, self.name, state_dir), remove_state_dir=True
            )
            reaped.append(sandbox_id)
        prefix = str(runtime_dir.resolve()) + "/"
        for pid in procs.pids_matching("--api-sock", prefix):
            args = procs.cmdline(pid)
            if not args or Path(args[0]).name != "firecracker":
                continue
            sock = Path(args[args.index("--api-sock") + 1])
            if (sock.parent / RECORD).exists():
                continue  # owned by a live host (its record was skipped above)
            await asyncio.to_thread(stop_pid, pid)
            sandbox_id = args[args.index("--id") + 1] if "--id" in args else sock.parent.name
            shutil.rmtree(sock.parent, ignore_errors=True)
            reaped.append(sandbox_id)
        return reaped

    # -- machinery ------------------------------------------------------------------------

    async def _hold_image(self, sandbox_id: str, directory: Path) -> None:
        """Mark the image in `directory` in use by this sandbox until its teardown."""
        try:
            use = await hold_image_async(directory)
        except ImageUnavailable as exc:
            raise DriverError(f"cannot start sandbox {sandbox_id}: {exc}") from None
        previous = self._image_uses.pop(sandbox_id, None)
        if previous is not None:
            previous.release()
        self._image_uses[sandbox_id] = use

    def _api(self, handle: SandboxHandle) -> FirecrackerApi:
        record = driver_record.read(handle.state_dir, RECORD)
        vm = Path(record["vm_root"]) if record else handle.state_dir
        return FirecrackerApi(vm / API_SOCK, self.api_timeout)

    async def _observe(self, api: FirecrackerApi) -> None:
        await api.call(
            "PUT",
            "/logger",
            {"log_path": "firecracker.log", "level": "Info", "show_level": True},
        )
        await api.call("PUT", "/metrics", {"metrics_path": "metrics.json"})

    def _prepare(
        self,
        handle: SandboxHandle,
        binaries: FirecrackerBinaries,
        memory_bytes: int,
        cpus: float,
        image: Path,
    ) -> Path:
        """Make the VM root and write the on-disk record *before* anything else exists, so a
        crash at any later point leaves something `reap` finds. Returns the VM root."""
        state_dir, sandbox_id = handle.state_dir, handle.sandbox_id
        jail = self.jailer
        if jail is not None:
            if binaries.jailer is None:
                raise DriverError("the jailer is configured but no jailer binary was found")
            vm = state_dir / "jail" / binaries.firecracker.name / sandbox_id / "root"
        else:
            vm = state_dir
        if len(str(vm / f"{VSOCK}_{CHANNEL_PORT}")) > UNIX_PATH_MAX:
            raise DriverError(
                f"{vm} is too deep for Unix socket paths (108 bytes); use a shorter runtime dir"
            )
        vm.mkdir(parents=True, exist_ok=True)
        driver_record.write(
            state_dir,
            RECORD,
            {
                "sandbox_id": sandbox_id,
                "pid": None,
                "start_ticks": None,
                "owner_pid": os.getpid(),
                "owner_start_ticks": start_ticks(os.getpid()),
                "vm_root": str(vm),
                "jailed": jail is not None,
                "uid": jail.uid if jail else 0,
                "gid": jail.gid if jail else 0,
                "cgroup_parent": CGROUP_PARENT if jail else None,
                "memory_bytes": memory_bytes,
                "cpus": cpus,
                "image": str(image),
            },
        )
        for name in ("metrics.json", "firecracker.log"):
            (vm / name).touch()
            if jail:
                os.chown(vm / name, jail.uid, jail.gid)
        if jail:
            os.chown(vm, jail.uid, jail.gid)
        handle.details.update({"vm_root": str(vm), "api_socket": str(vm / API_SOCK)})
        return vm

    async def _launch(self, handle: SandboxHandle, binaries: FirecrackerBinaries, vm: Path) -> None:
        """Start firecracker (directly, or through the jailer, which chroots into `vm`), record
        its pid, and wait (bounded) until its API socket answers. Everything the VM needs must
        already be in `vm`: the jailer's mount namespace does not see later bind mounts."""
        state_dir, sandbox_id = handle.state_dir, handle.sandbox_id
        record = driver_record.read(state_dir, RECORD)
        if record is None:
            raise DriverError(f"the record in {state_dir} vanished before launch")
        jail = self.jailer
        if jail is not None:
            argv = jailer_argv(
                jail,
                binaries,
                sandbox_id,
                state_dir / "jail",
                int(record["memory_bytes"]),
                float(record["cpus"]),
            )
        else:
            argv = [
                str(binaries.firecracker),
                "--api-sock", str(state_dir / API_SOCK),
                "--id", sandbox_id,
            ]  # fmt: skip
        with (state_dir / "console.log").open("ab") as console:
            proc = subprocess.Popen(
                argv,
                cwd=vm,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[sandbox_id] = proc
        handle.pid = proc.pid
        record.update({"pid": proc.pid, "start_ticks": start_ticks(proc.pid)})
        driver_record.write(state_dir, RECORD, record)
        started = time.monotonic()
        deadline = started + self.start_timeout
        async with FirecrackerApi(vm / API_SOCK, timeout=1.0) as api:
            while True:
                if proc.poll() is not None:
                    raise DriverError(
                        f"firecracker exited with code {proc.returncode} before its API was up: "
                        f"{tail(state_dir / 'console.log')}"
                    )
                if (vm / API_SOCK).exists():
                    with contextlib.suppress(DriverError):
                        await api.call("GET", "/")
                        break
                if time.monotonic() > deadline:
                    raise DriverError(
                        f"firecracker's API socket did not answer within {self.start_timeout}s"
                    )
                await asyncio.sleep(0.005)
        handle.details["api_ready_s"] = time.monotonic() - started

    def _place_files(
        self, handle: SandboxHandle, vm: Path, ext4: Path, kernel: GuestKernel
    ) -> None:
        place(bool(self.jailer), ext4, vm / "rootfs.ext4")
        place(bool(self.jailer), kernel.vmlinux, vm / "vmlinux")
        if kernel.initrd is not None:
            place(bool(self.jailer), kernel.initrd, vm / "initrd")
        if self.jailer:
            channel = self.channel_path(handle.state_dir)
            if channel.exists():
                # Same inode, so a connect() from inside the chroot reaches the host listener;
                # the jailed uid needs write permission on the socket to connect.
                os.chown(channel, self.jailer.uid, self.jailer.gid)
                with contextlib.suppress(FileExistsError):
                    os.link(channel, vm / channel.name)

    async def _teardown(self, handle: SandboxHandle, *, remove_state_dir: bool) -> None:
        """Stop the VM (only if the recorded pid is still that firecracker), unmount, drop
        cgroups, remove files. Idempotent; never raises for "already gone"."""
        state_dir = handle.state_dir
        record = driver_record.read(state_dir, RECORD)
        child = self._children.pop(handle.sandbox_id, None)
        if record is not None:
            # The recorded pid if it is still ours, plus any firecracker of this sandbox that
            # started before its pid reached the record (a crash in between).
            pids = {int(record["pid"])} if is_our_vm(record) else set()
            pids.update(vm_pids(record))
            for pid in pids:
                await asyncio.to_thread(stop_pid, pid)
        elif child is not None and child.poll() is None:
            await asyncio.to_thread(stop_pid, child.pid)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(child.wait, 5)
        use = self._image_uses.pop(handle.sandbox_id, None)
        if use is not None:
            use.release()  # the VM is stopped: its image is free
        await asyncio.to_thread(unmount_under, state_dir)
        if record is not None and record.get("cgroup_parent"):
            await asyncio.to_thread(
                cgroups.remove_sandbox, str(record["cgroup_parent"]), str(record["sandbox_id"])
            )
        if remove_state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)
        else:
            keep = {self.channel_path(state_dir).name, "console.log"}
            for entry in list(state_dir.iterdir()) if state_dir.is_dir() else []:
                if entry.name in keep:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
