"""The gVisor driver: one `runsc` sandbox per aamp sandbox.

Isolation choices, and why:
- `--network=none`: the guest's only interface is its own loopback; it has no route anywhere.
- `--platform=ptrace`: works on every host, including those without usable KVM.
- the image tree is the read-only root, and `--overlay` gives the guest a writable layer kept
  in the sandbox's own memory, so nothing the guest writes touches the host's disk and the
  memory limit bounds it.
- the host paths bound in are this sandbox's channel directory (one Unix socket that the
  host listens on; `--fsgofer-host-uds` lets the guest agent connect to it) and the spec's
  `read_only_files`, each a read-only bind of one host file: the guest can read it, and
  writing, truncating, renaming or removing it fails in the guest (a test checks each); the
  overlay wraps only writable mounts, so nothing of it is copied into sandbox memory either.
- cpu, memory and pids limits go into the OCI `linux.resources` and are enforced through the
  host's cgroups; the cgroup directories are removed on destroy, because runsc leaves them.
  A `background` spec (a warm pool's) also gets a low `cpu.shares` (128), so the whole boot —
  gofer, gVisor kernel, guest agent, all in that cgroup — yields to every sandbox in use;
  `foreground` writes the kernel's default back at hand-out.

While a sandbox lives, this driver holds a shared lock on its image's directory
(`aamp.sandbox.images.hold_image`), so `aamp image prune` and `image build --force` never delete
a tree a guest runs from; destroy (and reap) let go of it.

Every file this driver makes for a sandbox lives under its `state_dir`, and every runsc
process it starts carries the installation's runsc root in its command line, so `reap` can
find leftovers from disk and /proc alone after a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from aamp.sandbox import cgroup_mounts, cgroups, driver_record, procs
from aamp.sandbox.driver import (
    Driver,
    DriverError,
    DriverStatus,
    SandboxHandle,
    SandboxSpec,
)
from aamp.sandbox.images import ImageUnavailable, ImageUse, hold_image_async

if TYPE_CHECKING:
    from aamp.sandbox.images import BuiltImage

RUNSC = "runsc"
CHANNEL_DIR_IN_GUEST = "/run/aamp"
AGENT_IN_GUEST = "/opt/aamp/agent"
# The first process: the agent's first stage (`aamp/guest/first_stage.c`, compiled into every
# image), which serves the first command while the Python agent starts behind it.
FIRST_STAGE_IN_GUEST = "/opt/aamp/agent-init"
RECORD = "record.json"
# Where `runsc run` writes the sandbox process's pid (the gVisor kernel, what dies when the
# guest is killed): read back instead of scanning /proc, which blocks the event loop for
# milliseconds (more with more host processes) just as the guest's hello arrives.
PID_FILE = "sandbox.pid"
CPU_PERIOD_US = 100_000
# The host's pids cgroup counts host tasks. Under the ptrace platform every guest thread is a
# host thread, and the gVisor kernel itself runs ~40 threads when idle; so a policy's `pids`
# (guest processes) becomes room for 4 threads per process plus the kernel's own. Chromium
# with its helpers peaks near 400 host tasks here; a fork bomb still hits the limit at once.
THREADS_PER_PROCESS = 4
SANDBOX_KERNEL_TASKS = 64
# What runsc (cgroup v1) writes a sandbox's limits into: cpu, memory and pids carry this
# driver's limits (and memory and pids tell why a guest died); runsc also refuses to start
# without blkio and cpuset, which it treats as mandatory. The other controllers it knows
# (cpuacct, devices, freezer, ...) it skips when they are absent.
REQUIRED_CGROUP_CONTROLLERS = ("blkio", "cpu", "cpuset", "memory", "pids")


class GVisorDriver(Driver):
    name = "gvisor"
    mounts_files = True

    def __init__(self, runtime_dir: Path, *, runsc: str = RUNSC, platform: str = "ptrace"):
        self.runtime_dir = runtime_dir
        self.runsc_root = runtime_dir / "runsc"
        self.runsc = runsc
        self.platform = platform
        # One cgroup parent per installation, so two installations never reap each other.
        self.cgroup_parent = (
            runtime_dir.name if runtime_dir.name.startswith("aamp") else f"aamp-{runtime_dir.name}"
        )
        # The image each live sandbox of this instance runs from, held until it is removed.
        self._image_uses: dict[str, ImageUse] = {}

    # -- contract -------------------------------------------------------------------------

    def probe(self) -> DriverStatus:
        """Whether `create` can start a sandbox here: runsc present and runnable, root, and the
        cgroup controllers a sandbox's limits go through mounted and writable."""
        path = shutil.which(self.runsc)
        if path is None:
            return DriverStatus(
                self.name,
                False,
                "runsc is not installed; install the Debian package `runsc`",
            )
        if os.geteuid() != 0:
            return DriverStatus(
                self.name, False, "runsc needs root here (cgroups and mounts); run aamp as root"
            )
        cgroups = cgroup_mounts.problems(REQUIRED_CGROUP_CONTROLLERS)
        if cgroups is not None:
            return DriverStatus(
                self.name,
                False,
                f"no sandbox can start here: runsc puts each sandbox's limits into cgroups, "
                f"and {cgroups}",
            )
        version = procs.run_quiet([path, "--version"]).splitlines()[:1]
        if not version:
            return DriverStatus(self.name, False, f"{path} does not run (`runsc --version` failed)")
        return DriverStatus(
            self.name, True, f"{path} ({version[0]}), platform {self.platform}, no network"
        )

    def channel_path(self, state_dir: Path) -> Path:
        return state_dir / "chan" / "agent.sock"

    def egress_path(self, state_dir: Path) -> Path:
        # Same directory as the channel: it is the one host directory bound into the guest.
        return state_dir / "chan" / "egress.sock"

    async def create(
        self, sandbox_id: str, spec: SandboxSpec, image: BuiltImage, state_dir: Path
    ) -> SandboxHandle:
        try:
            use = await hold_image_async(image.root.parent)
        except ImageUnavailable as exc:
            raise DriverError(f"cannot start sandbox {sandbox_id}: {exc}") from None
        self._release_image(sandbox_id)
        self._image_uses[sandbox_id] = use
        try:
            return await self._start(sandbox_id, spec, image, state_dir)
        except BaseException:
            self._release_image(sandbox_id)
            raise

    async def _start(
        self, sandbox_id: str, spec: SandboxSpec, image: BuiltImage, state_dir: Path
    ) -> SandboxHandle:
        _check_first_stage(sandbox_id, image)
        bundle = state_dir / "bundle"
        bundle.mkdir(parents=True, exist_ok=True)
        self.runsc_root.mkdir(parents=True, exist_ok=True)
        config = self._oci_config(sandbox_id, spec, image.root, self.channel_path(state_dir).parent)
        (bundle / "config.json").write_text(json.dumps(config, indent=1))
        handle = SandboxHandle(sandbox_id=sandbox_id, driver=self.name, state_dir=state_dir)
        driver_record.write(
            state_dir,
            RECORD,
            {
                "driver": self.name,
                "id": sandbox_id,
                "created": time.time(),
                "host_pid": os.getpid(),
            },
        )

        log_path = state_dir / "guest.log"
        with open(log_path, "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *self._global_flags(),
                "run",
                "--detach",
                f"--pid-file={state_dir / PID_FILE}",
                "--bundle",
                str(bundle),
                sandbox_id,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        rc = await proc.wait()
        if rc != 0:
            tail = log_path.read_text(errors="replace")[-2000:]
            await self.destroy(handle)
            raise DriverError(f"runsc could not start sandbox {sandbox_id} (exit {rc}): {tail}")
        handle.pid = _sandbox_pid(state_dir / PID_FILE)
        return handle

    def exited(self, handle: SandboxHandle) -> str | None:
        if handle.pid is None or procs.pid_alive(handle.pid):
            return None
        return cgroups.death_reason(self.cgroup_parent, handle.sandbox_id)

    def foreground(self, handle: SandboxHandle) -> None:
        try:
            cgroups.set_cpu_shares(self.cgroup_parent, handle.sandbox_id, cgroups.NORMAL_CPU_SHARES)
        except OSError as exc:
            message = f"cannot raise sandbox {handle.sandbox_id}'s CPU weight: {exc}"
            raise DriverError(message) from None

    async def destroy(self, handle: SandboxHandle) -> None:
        await self._remove(handle.sandbox_id, handle.state_dir)

    async def reap(self, runtime_dir: Path) -> list[str]:
        reaped: list[str] = []
        sandboxes = runtime_dir / "sb"
        ids = (
            {p.name for p in sandboxes.iterdir() if _record_driver(p) == self.name}
            if (sandboxes.is_dir())
            else set()
        )
        ids |= set(await asyncio.to_thread(self._runsc_container_ids))
        for sandbox_id in sorted(ids):
            await self._remove(sandbox_id, sandboxes / sandbox_id)
            reaped.append(sandbox_id)
        # Whatever runsc process still names our root now has no sandbox record: kill it.
        await asyncio.to_thread(procs.kill_matching, f"--root={self.runsc_root}")
        await asyncio.to_thread(cgroups.remove_parent, self.cgroup_parent)
        return reaped

    # -- internals ------------------------------------------------------------------------

    def _global_flags(self) -> list[str]:
        return [
            self.runsc,
            f"--root={self.runsc_root}",
            f"--platform={self.platform}",
            "--network=none",
            "--overlay",
            "--fsgofer-host-uds",
        ]

    def _oci_config(
        self, sandbox_id: str, spec: SandboxSpec, rootfs: Path, channel_dir: Path
    ) -> dict[str, object]:
        res = spec.resources
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
        }
        return {
            "ociVersion": "1.0.2",
            "process": {
                "terminal": False,
                "user": {"uid": 0, "gid": 0},
                "args": [
                    FIRST_STAGE_IN_GUEST,
                    AGENT_IN_GUEST,
                    "--connect",
                    f"unix:{CHANNEL_DIR_IN_GUEST}/agent.sock",
                    "--egress",
                    f"unix:{CHANNEL_DIR_IN_GUEST}/egress.sock",
                ],
                "env": [f"{k}={v}" for k, v in env.items()],
                "cwd": "/",
                "capabilities": _capabilities(),
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
                "noNewPrivileges": True,
            },
            # Writable only through --overlay, whose upper layer lives in sandbox memory: the
            # image tree on the host is never written (a test checks it).
            "root": {"path": str(rootfs), "readonly": False},
            "hostname": "sandbox",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {
                    "destination": "/dev",
                    "type": "tmpfs",
                    "source": "tmpfs",
                    "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
                },
                {
                    "destination": "/sys",
                    "type": "sysfs",
                    "source": "sysfs",
                    "options": ["nosuid", "noexec", "nodev", "ro"],
                },
                {
                    "destination": "/tmp",
                    "type": "tmpfs",
                    "source": "tmpfs",
                    "options": ["nosuid", "nodev", "mode=1777"],
                },
                {
                    "destination": CHANNEL_DIR_IN_GUEST,
                    "type": "bind",
                    "source": str(channel_dir),
                    "options": ["rbind", "rw"],
                },
                *(
                    {
                        "destination": f.target,
                        "type": "bind",
                        "source": str(f.source),
                        "options": ["bind", "ro", "nosuid", "nodev", "noexec"],
                    }
                    for f in spec.read_only_files
                ),
            ],
            "linux": {
                "cgroupsPath": f"/{self.cgroup_parent}/{sandbox_id}",
                "resources": {
                    "memory": {"limit": res.memory_bytes},
                    "pids": {"limit": res.pids * THREADS_PER_PROCESS + SANDBOX_KERNEL_TASKS},
                    "cpu": {
                        "quota": int(res.cpus * CPU_PERIOD_US),
                        "period": CPU_PERIOD_US,
                        **({"shares": cgroups.BACKGROUND_CPU_SHARES} if spec.background else {}),
                    },
                },
                "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
            },
        }

    def _runsc_container_ids(self) -> list[str]:
        if not self.runsc_root.is_dir():
            return []
        out = procs.run_quiet([*self._global_flags(), "list", "--quiet"])
        return [line.strip() for line in out.splitlines() if line.strip()]

    async def _remove(self, sandbox_id: str, state_dir: Path) -> None:
        # Killing waits for the processes to go and a busy cgroup is retried: both sleep, so
        # the removal runs off the event loop, as one piece that finishes even if its caller
        # is cancelled.
        await asyncio.to_thread(self._remove_now, sandbox_id, state_dir)

    def _remove_now(self, sandbox_id: str, state_dir: Path) -> None:
        # `runsc delete --force` polls for a second or two; killing the sandbox and gofer
        # processes (found by our runsc root and this sandbox's bundle path) and then removing
        # runsc's two state files does the same work at once, and works after a host crash.
        procs.kill_matching(f"--root={self.runsc_root}", str(state_dir / "bundle"))
        procs.kill_matching(f"--root={self.runsc_root}", sandbox_id)
        for suffix in (".state", ".lock"):
            (self.runsc_root / f"{sandbox_id}_sandbox:{sandbox_id}{suffix}").unlink(missing_ok=True)
        cgroups.remove_sandbox(self.cgroup_parent, sandbox_id)
        self._release_image(sandbox_id)  # its processes are gone: the image is free
        if state_dir.exists():
            shutil.rmtree(state_dir, ignore_errors=True)

    def _release_image(self, sandbox_id: str) -> None:
        use = self._image_uses.pop(sandbox_id, None)
        if use is not None:
            use.release()


def _check_first_stage(sandbox_id: str, image: BuiltImage) -> None:
    """The guest's first process must be in the image: one built before the first stage was
    (or damaged since) would otherwise fail inside runsc with a message about exec."""
    first_stage = image.root / FIRST_STAGE_IN_GUEST.lstrip("/")
    if not first_stage.is_file() or not os.access(first_stage, os.X_OK):
        raise DriverError(
            f"cannot start sandbox {sandbox_id}: image {image.name}@{image.content_hash[:12]}"
            f" has no executable {FIRST_STAGE_IN_GUEST} (the guest agent's first stage; the"
            f" image was built by an older aamp or was changed since); rebuild it:"
            f" aamp image build {image.name} --force"
        )


def _sandbox_pid(pid_file: Path) -> int | None:
    """The pid runsc wrote for the sandbox process, or None if it wrote none."""
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _capabilities() -> dict[str, list[str]]:
    # The guest's root is root of a gVisor kernel only; keep the usual container set anyway.
    caps = [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETPCAP",
        "CAP_SYS_CHROOT",
        "CAP_AUDIT_WRITE",
    ]
    return {k: caps for k in ("bounding", "effective", "permitted")}


def _record_driver(state_dir: Path) -> str | None:
    return (driver_record.read(state_dir, RECORD) or {}).get("driver")
