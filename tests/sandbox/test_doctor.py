"""`aamp doctor` says, in plain words, which drivers work on this host and why not."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aamp.sandbox import cgroup_mounts
from aamp.sandbox.gvisor import REQUIRED_CGROUP_CONTROLLERS, GVisorDriver
from aamp.sandbox.kvm import detect_kvm

needs_gvisor_host = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("runsc") is None
    or cgroup_mounts.problems(REQUIRED_CGROUP_CONTROLLERS) is not None,
    reason="needs root, runsc and this host's cgroup v1 mounts (these tests hide them)",
)


def doctor(settings, wrapper: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AAMP_HOME": str(settings.home), "AAMP_IMAGE_DIR": str(settings.image_dir)}
    return subprocess.run(
        [*wrapper, sys.executable, "-m", "aamp", "doctor"], env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


def line_for(output: str, driver: str) -> str:
    return next(line for line in output.splitlines() if line[4:].startswith(f"{driver}:"))


def test_doctor_names_each_driver_with_its_reason(settings):
    done = doctor(settings)
    gvisor = line_for(done.stdout, "gvisor")
    cgroups = cgroup_mounts.problems(REQUIRED_CGROUP_CONTROLLERS)
    if shutil.which("runsc") and os.geteuid() == 0 and cgroups is None:
        assert gvisor.startswith("ok  ") and "runsc" in gvisor
        assert done.returncode == 0
    else:
        assert gvisor.startswith("no  ")
    firecracker = line_for(done.stdout, "firecracker")
    kvm = detect_kvm()
    if kvm.pvm:
        assert firecracker.startswith("no  ")
        assert "kvm_pvm" in firecracker and "stock kernel never boots" in firecracker
    elif not kvm.available:
        assert firecracker.startswith("no  ") and "/dev/kvm" in firecracker


def test_doctor_lists_built_images(settings, base_image):
    assert f"base ({base_image.content_hash[:12]})" in doctor(settings).stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hide runsc from PATH meaningfully")
def test_doctor_without_runsc_says_what_to_install(settings, tmp_path):
    env = {
        **os.environ,
        "AAMP_HOME": str(settings.home),
        "PATH": str(tmp_path),  # no runsc, no debootstrap
    }
    done = subprocess.run(
        [sys.executable, "-m", "aamp", "doctor"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert "install the Debian package `runsc`" in done.stdout
    assert "install the Debian package `debootstrap`" in done.stdout


NOT_MOUNTED = "the cgroup controllers blkio, cpu, cpuset, memory, pids are not mounted"


@needs_gvisor_host
def test_doctor_inside_ip_netns_exec_says_no_sandbox_can_start(settings):
    # `ip netns exec` remounts /sys, so /sys/fs/cgroup is empty there and runsc fails on
    # `stat /sys/fs/cgroup/cpu`; the doctor used to say "ok gvisor" all the same.
    name = f"aamp-doctor-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        done = doctor(settings, ("ip", "netns", "exec", name))
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)
    gvisor = line_for(done.stdout, "gvisor")
    assert gvisor.startswith("no  gvisor: no sandbox can start"), gvisor
    assert f"{NOT_MOUNTED} under /sys/fs/cgroup" in gvisor
    assert "ip netns exec" in gvisor  # says where this usually comes from


@needs_gvisor_host
def test_doctor_with_the_cgroup_mounts_hidden_says_no_sandbox_can_start(settings):
    hide = 'mount -t tmpfs aamp-hide /sys/fs/cgroup && exec "$@"'
    done = doctor(settings, ("unshare", "-m", "sh", "-c", hide, "sh"))
    gvisor = line_for(done.stdout, "gvisor")
    assert gvisor.startswith("no  gvisor: no sandbox can start"), gvisor
    assert NOT_MOUNTED in gvisor


# What each case does to /sys/fs/cgroup inside a private mount namespace, and the words the
# probe must then give (None: the probe must say ok, since runsc does not need what is gone).
HIDDEN_CGROUPS = {
    "nothing hidden": ("true", None),
    "all hidden": ("mount -t tmpfs aamp-hide /sys/fs/cgroup", NOT_MOUNTED),
    "pids unmounted": ("umount /sys/fs/cgroup/pids", "controller pids is not mounted"),
    "blkio unmounted": ("umount /sys/fs/cgroup/blkio", "controller blkio is not mounted"),
    "cpuset unmounted": ("umount /sys/fs/cgroup/cpuset", "controller cpuset is not mounted"),
    "memory read-only": (
        "mount -o remount,bind,ro /sys/fs/cgroup/memory",
        "controller memory is mounted read-only",
    ),
    "cgroup v2 only": (
        "mount -t cgroup2 aamp-v2 /sys/fs/cgroup",
        "cgroup v2 (unified) hierarchy only",
    ),
    "controllers runsc skips unmounted": (
        "umount /sys/fs/cgroup/cpuacct /sys/fs/cgroup/devices /sys/fs/cgroup/freezer",
        None,
    ),
}


@needs_gvisor_host
@pytest.mark.usefixtures("base_image")
@pytest.mark.parametrize("case", list(HIDDEN_CGROUPS))
def test_the_gvisor_probe_says_no_exactly_where_a_sandbox_cannot_start(settings, case):
    setup, words = HIDDEN_CGROUPS[case]
    env = {
        "AAMP_HOME": str(settings.home),
        "AAMP_RUNTIME_DIR": str(settings.runtime_dir),
        "AAMP_IMAGE_DIR": str(settings.image_dir),
    }
    probe = Path(__file__).with_name("cgroup_probe.py")
    script = f'{setup} && exec "$@"'
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, str(probe), json.dumps(env)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if words is None:
        assert report["usable"], report["reason"]
        assert report["failure"] is None, report["failure"]
    else:
        assert not report["usable"]
        assert report["reason"].startswith("no sandbox can start"), report["reason"]
        assert words in report["reason"]
        assert report["failure"] is not None  # and runsc really could not start one
    # Whatever the attempt made in the cgroups the host sees is gone again.
    parent = GVisorDriver(settings.runtime_dir).cgroup_parent
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{parent}"))


@needs_gvisor_host
def test_a_runsc_that_does_not_run_is_not_usable(settings, tmp_path):
    broken = tmp_path / "runsc"
    broken.write_text("#!/bin/sh\necho 'runsc: cannot execute binary file' >&2\nexit 126\n")
    broken.chmod(0o755)
    status = GVisorDriver(settings.runtime_dir, runsc=str(broken)).probe()
    assert not status.usable
    assert status.reason == f"{broken} does not run (`runsc --version` failed)"
