"""`aamp doctor` says, in plain words, which drivers work on this host and why not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from aamp.sandbox.kvm import detect_kvm


def doctor(settings) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AAMP_HOME": str(settings.home), "AAMP_IMAGE_DIR": str(settings.image_dir)}
    return subprocess.run(
        [sys.executable, "-m", "aamp", "doctor"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def line_for(output: str, driver: str) -> str:
    return next(line for line in output.splitlines() if line[4:].startswith(f"{driver}:"))


def test_doctor_names_each_driver_with_its_reason(settings):
    done = doctor(settings)
    gvisor = line_for(done.stdout, "gvisor")
    if shutil.which("runsc") and os.geteuid() == 0:
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
