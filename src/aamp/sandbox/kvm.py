"""Can this host run Firecracker guests? Detected from the host, never assumed.

Three facts decide it, in this order:
- `/dev/kvm` exists and this process may open it (read+write);
- the KVM API answers (`KVM_GET_API_VERSION` returns 12, the only stable version);
- which module provides it: `kvm_pvm` (visible as /sys/module/kvm_pvm) is a nested,
  software-assisted KVM. Firecracker starts and configures guests on it, but only kernels
  built for PVM boot; a stock kernel never boots there (the vCPU spins without one exit).

The doctor prints `KvmStatus.reason` as is, and the tests use it as their skip reason.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

# _IO(KVMIO=0xAE, 0x00): the first ioctl every KVM user makes; the answer is always 12.
KVM_GET_API_VERSION = 0xAE00
KVM_API_VERSION = 12

PVM_MESSAGE = (
    "this host's /dev/kvm is the kvm_pvm module (nested, software-assisted): Firecracker "
    "starts but only PVM-enabled guest kernels boot; a stock kernel never boots here"
)


@dataclass(frozen=True)
class KvmStatus:
    available: bool  # /dev/kvm opens and answers the KVM API
    pvm: bool  # that KVM is kvm_pvm: stock guest kernels cannot boot
    reason: str  # plain words, for the doctor and for test skip reasons

    @property
    def boots_stock_kernels(self) -> bool:
        return self.available and not self.pvm


def detect_kvm(dev: Path = Path("/dev/kvm"), sys_module: Path = Path("/sys/module")) -> KvmStatus:
    """Look at this host's KVM. `dev` and `sys_module` are parameters so the doctor can be
    pointed elsewhere; they default to the real places."""
    if not dev.exists():
        return KvmStatus(
            False,
            False,
            f"{dev} does not exist: this host has no hardware virtualisation exposed "
            "(enable VT-x/AMD-V, or nested virtualisation for a VM, and load kvm_intel/kvm_amd)",
        )
    try:
        fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        hint = (
            "add this user to the 'kvm' group or run as root"
            if exc.errno in (errno.EACCES, errno.EPERM)
            else "check the kvm module"
        )
        return KvmStatus(False, False, f"{dev} is not accessible ({exc.strerror}); {hint}")
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
    except OSError as exc:
        return KvmStatus(False, False, f"{dev} does not answer the KVM API ({exc.strerror})")
    finally:
        os.close(fd)
    if version != KVM_API_VERSION:
        return KvmStatus(
            False, False, f"{dev} speaks KVM API version {version}, Firecracker needs 12"
        )
    if (sys_module / "kvm_pvm").is_dir():
        return KvmStatus(True, True, PVM_MESSAGE)
    vendor = next((m for m in ("kvm_intel", "kvm_amd") if (sys_module / m).is_dir()), "kvm")
    return KvmStatus(True, False, f"{dev} is usable ({vendor}, KVM API {version})")
