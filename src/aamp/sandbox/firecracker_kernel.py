"""The guest kernel (and the small initramfs it needs) for Firecracker guests.

Firecracker on x86_64 loads an uncompressed ELF `vmlinux`. We take Debian's own cloud kernel
(`linux-image-cloud-amd64`, fetched with `apt-get download` from this host's apt sources or
from `AAMP_DEBIAN_MIRROR`) and unpack it without root: `dpkg-deb -x`, then the compressed
payload is cut out of the bzImage using the boot-protocol header (`payload_offset` /
`payload_length`, boot protocol >= 2.08) and decompressed. Debian's kernel uses LZ4 in the
kernel's *legacy* frame format (checked: `CONFIG_KERNEL_LZ4=y`), which no stdlib module reads,
so that one case uses the `lz4` package's block decoder; gzip, xz, lzma and bzip2 payloads are
handled by the stdlib. The result must start with the ELF magic and have the size the kernel
build recorded at the end of the payload.

Debian builds virtio-mmio, virtio-blk and vsock as modules, so the kernel alone cannot mount
the root drive. `ensure_initrd` therefore builds a tiny gzip'd cpio initramfs from the same
package's modules plus Debian's `busybox-static`: its /init loads those modules, mounts the
read-only image (/dev/vda) and the scratch drive (/dev/vdb on /workspace), and `switch_root`s
into the guest agent, passing on the arguments the kernel received after `--`.

An operator may instead set `AAMP_FIRECRACKER_KERNEL` (an ELF vmlinux, or a bzImage we
convert) and optionally `AAMP_FIRECRACKER_INITRD`; such a kernel must then have what it needs
built in (or come with its own initrd).

Everything is cached under `$AAMP_HOME/kernels` (or `AAMP_DOWNLOAD_CACHE/kernels`), keyed by
the Debian package versions, and written to a temporary name then renamed.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from aamp.config import Settings
from aamp.sandbox.debian_mirror import bundle_repository, stanza_fields
from aamp.sandbox.driver import DriverError
from aamp.sandbox.kernel_packages import BUSYBOX_PACKAGE, KERNEL_META_PACKAGE

ELF_MAGIC = b"\x7fELF"
LZ4_LEGACY_MAGIC = 0x184C2102
LZ4_LEGACY_BLOCK = 8 << 20  # the legacy format's fixed uncompressed block size
APT_TIMEOUT_S = 600.0
# Loaded in this order by the initramfs (each after its dependencies, from modules.dep).
INITRD_MODULES = (
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_blk",
    "vsock",
    "vmw_vsock_virtio_transport_common",
    "vmw_vsock_virtio_transport",
)

Progress = Callable[[str], None]


class KernelError(DriverError):
    """The guest kernel could not be obtained or is not something Firecracker can load."""


@dataclass(frozen=True)
class GuestKernel:
    vmlinux: Path
    initrd: Path | None


def kernel_cache_dir(settings: Settings) -> Path:
    base = settings.download_cache if settings.download_cache else settings.home
    return base / "kernels"


def _safe(version: str) -> str:
    return version.replace(":", "_")  # Debian epochs ("1:1.35") make awkward file names


def _kernel_dir(settings: Settings, package: str, version: str) -> Path:
    return kernel_cache_dir(settings) / f"{package}_{_safe(version)}"


# -- public entry points -----------------------------------------------------------------------


def ensure_kernel(
    settings: Settings, progress: Progress | None = None, apt: Apt | None = None
) -> Path:
    """Path of an ELF vmlinux for Firecracker: the operator's, or Debian's cloud kernel."""
    say = progress or (lambda _msg: None)
    operator = settings.env.get("AAMP_FIRECRACKER_KERNEL")
    if operator:
        return _operator_kernel(Path(operator).resolve(), settings, say)
    apt = apt or Apt(settings)
    package, version = apt.kernel_package()
    target = _kernel_dir(settings, package, version) / "vmlinux"
    if _is_elf(target):
        return target
    with tempfile.TemporaryDirectory(prefix="aamp-kernel-") as tmp:
        tree = apt.download_and_unpack(package, Path(tmp), say)
        bzimages = sorted((tree / "boot").glob("vmlinuz-*"))
        if not bzimages:
            raise KernelError(f"{package} {version} has no /boot/vmlinuz-*")
        say(f"extracting vmlinux from {bzimages[0].name}")
        _atomic_write(target, bzimage_to_vmlinux(bzimages[0].read_bytes()))
    return target


def ensure_guest_kernel(settings: Settings, progress: Progress | None = None) -> GuestKernel:
    """The kernel plus the initramfs it needs (None for an operator kernel without one)."""
    if settings.env.get("AAMP_FIRECRACKER_KERNEL"):
        vmlinux = ensure_kernel(settings, progress)
        initrd = settings.env.get("AAMP_FIRECRACKER_INITRD")
        if initrd and not Path(initrd).is_file():
            raise KernelError(f"AAMP_FIRECRACKER_INITRD={initrd} is not a file")
        return GuestKernel(vmlinux, Path(initrd).resolve() if initrd else None)
    apt = Apt(settings)  # one package lookup for both files
    return GuestKernel(
        ensure_kernel(settings, progress, apt), ensure_initrd(settings, progress, apt)
    )


def ensure_initrd(
    settings: Settings, progress: Progress | None = None, apt: Apt | None = None
) -> Path:
    """A gzip'd cpio initramfs with the virtio/vsock modules of Debian's cloud kernel."""
    say = progress or (lambda _msg: None)
    apt = apt or Apt(settings)
    package, version = apt.kernel_package()
    bb_version = apt.candidate_version(BUSYBOX_PACKAGE)
    target = _kernel_dir(settings, package, version) / f"initrd-busybox_{_safe(bb_version)}.img"
    if target.is_file() and target.read_bytes()[:2] == b"\x1f\x8b":
        return target
    with tempfile.TemporaryDirectory(prefix="aamp-initrd-") as tmp:
        kernel_tree = apt.download_and_unpack(package, Path(tmp) / "k", say)
        bb_tree = apt.download_and_unpack(BUSYBOX_PACKAGE, Path(tmp) / "b", say)
        say("building the guest initramfs")
        _atomic_write(target, build_initrd(kernel_tree, bb_tree / "bin" / "busybox"))
    return target


# -- bzImage -> vmlinux ------------------------------------------------------------------------


def bzimage_to_vmlinux(image: bytes) -> bytes:
    """Decompress the kernel inside an x86 bzImage. Raises KernelError naming what is wrong."""
    if image[:4] == ELF_MAGIC:
        return image
    if len(image) < 0x250 or image[0x202:0x206] != b"HdrS":
        raise KernelError("not an x86 bzImage (no 'HdrS' boot header) and not an ELF vmlinux")
    protocol = struct.unpack_from("<H", image, 0x206)[0]
    if protocol < 0x208:
        raise KernelError(f"boot protocol {protocol:#x} is too old (need 2.08+ payload fields)")
    setup_sects = image[0x1F1] or 4
    offset, length = struct.unpack_from("<II", image, 0x248)
    start = (setup_sects + 1) * 512 + offset
    payload = image[start : start + length]
    if len(payload) != length or length < 8:
        raise KernelError("the bzImage payload lies outside the file (truncated image?)")
    vmlinux = _decompress_payload(payload)
    if vmlinux[:4] != ELF_MAGIC:
        raise KernelError("the decompressed kernel does not start with the ELF magic")
    return vmlinux


def _decompress_payload(payload: bytes) -> bytes:
    recorded = struct.unpack_from("<I", payload, len(payload) - 4)[0]
    head = payload[:6]
    if head[:2] == b"\x1f\x8b":
        return gzip.decompress(payload)  # gzip carries its own size; nothing appended
    if head == b"\xfd7zXZ\x00":
        out = lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(payload)
    elif head[:3] == b"\x5d\x00\x00":
        out = lzma.LZMADecompressor(lzma.FORMAT_ALONE).decompress(payload)
    elif head[:3] == b"BZh":
        out = bz2.BZ2Decompressor().decompress(payload)
    elif struct.unpack_from("<I", payload)[0] == LZ4_LEGACY_MAGIC:
        out = _lz4_legacy(payload[:-4])
    elif head[:4] == b"\x28\xb5\x2f\xfd":
        raise KernelError("this kernel is zstd-compressed; give an ELF vmlinux instead")
    else:
        raise KernelError(f"unknown kernel compression (payload starts {head.hex()})")
    if len(out) != recorded:
        raise KernelError(f"decompressed kernel is {len(out)} bytes, the image says {recorded}")
    return out


def _lz4_legacy(stream: bytes) -> bytes:
    """The kernel's `lz4 -l` format: magic, then (le32 size, LZ4 block) pairs of <= 8 MiB."""
    import lz4.block  # the one decoder the stdlib lacks; imported only when needed

    out = io.BytesIO()
    pos = 0
    while pos + 4 <= len(stream):
        size = struct.unpack_from("<I", stream, pos)[0]
        pos += 4
        if size == LZ4_LEGACY_MAGIC:  # concatenated streams start again with the magic
            continue
        if pos + size > len(stream):
            raise KernelError("LZ4 kernel payload is truncated")
        try:
            out.write(
                lz4.block.decompress(stream[pos : pos + size], uncompressed_size=LZ4_LEGACY_BLOCK)
            )
        except lz4.block.LZ4BlockError as exc:
            raise KernelError(f"LZ4 kernel payload is corrupt: {exc}") from None
        pos += size
    return out.getvalue()


# -- initramfs ---------------------------------------------------------------------------------

INIT_SCRIPT = """#!/bin/busybox sh
# aamp guest initramfs: load virtio/vsock modules, mount the image read-only and the scratch
# drive on /workspace, then hand PID 1 to the guest agent with the kernel's `--` arguments.
bb=/bin/busybox
$bb mkdir -p /proc /sys /dev /newroot
$bb mount -t proc proc /proc
$bb mount -t sysfs sysfs /sys
$bb mount -t devtmpfs devtmpfs /dev
for m in MODULES; do
  $bb insmod /lib/modules/$m.ko || echo "aamp-initrd: insmod $m failed"
done
agent=/opt/aamp/agent
for word in $($bb cat /proc/cmdline); do
  case "$word" in init=*) agent="${word#init=}" ;; esac
done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 200 ]; do $bb usleep 10000; i=$((i+1)); done
if ! $bb mount -t ext4 -o ro /dev/vda /newroot; then
  echo "aamp-initrd: cannot mount the image (/dev/vda)"; $bb poweroff -f
fi
if [ -b /dev/vdb ] && [ -d /newroot/workspace ]; then
  $bb mount -t ext4 /dev/vdb /newroot/workspace || echo "aamp-initrd: cannot mount /dev/vdb"
fi
$bb mount --move /dev /newroot/dev 2>/dev/null || $bb umount /dev
$bb umount /sys /proc
exec $bb switch_root /newroot "$agent" "$@"
"""


def build_initrd(kernel_tree: Path, busybox: Path) -> bytes:
    """A gzip'd newc cpio archive (reproducible: fixed order, mtime 0)."""
    if not busybox.is_file():
        raise KernelError(f"{busybox} is missing (is {BUSYBOX_PACKAGE} unpacked?)")
    module_dirs = sorted((kernel_tree / "lib" / "modules").glob("*"))
    if not module_dirs:
        raise KernelError(f"no lib/modules in the unpacked kernel at {kernel_tree}")
    found = {p.stem: p for p in module_dirs[0].rglob("*.ko")}
    missing = [m for m in INITRD_MODULES if m not in found]
    if missing:
        raise KernelError(f"the kernel package lacks modules {', '.join(missing)}")
    init = INIT_SCRIPT.replace("MODULES", " ".join(INITRD_MODULES)).encode()
    entries: list[tuple[str, int, bytes, tuple[int, int]]] = [
        (d, 0o040755, b"", (0, 0)) for d in ("bin", "dev", "lib", "lib/modules", "newroot")
    ]
    entries += [
        ("dev/console", 0o020600, b"", (5, 1)),
        ("init", 0o100755, init, (0, 0)),
        ("bin/busybox", 0o100755, busybox.read_bytes(), (0, 0)),
    ]
    entries += [
        (f"lib/modules/{m}.ko", 0o100644, found[m].read_bytes(), (0, 0)) for m in INITRD_MODULES
    ]
    return gzip.compress(cpio_newc(entries), mtime=0)


def cpio_newc(entries: Iterable[tuple[str, int, bytes, tuple[int, int]]]) -> bytes:
    """The kernel's initramfs format ("newc"): 110-byte ASCII header, name, data, 4-aligned."""
    out = io.BytesIO()

    def pad() -> None:
        out.write(b"\0" * (-out.tell() % 4))

    for ino, (name, mode, data, (rmajor, rminor)) in enumerate(
        [*entries, ("TRAILER!!!", 0, b"", (0, 0))], start=1
    ):
        raw = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmajor, rminor, len(raw), 0)
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + raw)
        pad()
        out.write(data)
        pad()
    return out.getvalue()


# -- apt ---------------------------------------------------------------------------------------


class Apt:
    """apt-cache / apt-get download as this host's apt does, or against AAMP_DEBIAN_MIRROR
    (then with a private sources list and package lists under the kernel cache)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._shown: dict[str, dict[str, str]] = {}
        self.options: list[str] = []
        local = bundle_repository(settings)
        if local is not None:  # checked by the bundle's manifest, not by an index signature
            self.options = self._mirror_options(local.as_uri(), "[trusted=yes] ")
        elif settings.debian_mirror:
            self.options = self._mirror_options(settings.debian_mirror)

    def _mirror_options(self, mirror: str, options: str = "") -> list[str]:
        state = kernel_cache_dir(self.settings) / "apt"
        lists = state / "lists"
        (lists / "partial").mkdir(parents=True, exist_ok=True)
        sources = state / "sources.list"
        suite = _os_release().get("VERSION_CODENAME", "bookworm")
        sources.write_text(f"deb {options}{mirror.rstrip('/')} {suite} main\n")
        opts = [
            f"-oDir::Etc::SourceList={sources}",
            "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={lists}",
            f"-oDir::Cache={state / 'cache'}",
        ]
        if options or not any(lists.glob("*Packages*")):  # a local repository: always current
            self._run(["apt-get", *opts, "-q", "update"], "apt-get update")
        return opts

    def _run(self, argv: list[str], what: str, cwd: Path | None = None) -> str:
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=APT_TIMEOUT_S, cwd=cwd, check=False
            )
        except FileNotFoundError:
            raise KernelError(f"{argv[0]} is not installed; this needs a Debian host") from None
        except subprocess.TimeoutExpired:
            raise KernelError(f"{what} did not finish in {APT_TIMEOUT_S:.0f}s") from None
        if done.returncode != 0:
            tail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise KernelError(f"{what} failed: {tail}")
        return done.stdout

    def show(self, *packages: str) -> dict[str, dict[str, str]]:
        """Candidate fields of each package, from one `apt-cache show` (it costs ~0.6 s)."""
        wanted = [p for p in packages if p not in self._shown]
        if wanted:
            out = self._run(
                ["apt-cache", *self.options, "show", "--no-all-versions", *wanted],
                f"apt-cache show {' '.join(wanted)}",
            )
            for stanza in out.split("\n\n"):
                fields = stanza_fields(stanza)
                if "Package" in fields and "Version" in fields:
                    self._shown.setdefault(fields["Package"], fields)
        missing = [p for p in packages if p not in self._shown]
        if missing:
            raise KernelError(f"apt knows no package {', '.join(missing)}; run apt-get update")
        return {p: self._shown[p] for p in packages}

    def candidate_version(self, package: str) -> str:
        return self.show(package)[package]["Version"]

    def kernel_package(self) -> tuple[str, str]:
        """The concrete linux-image-<abi>-cloud-amd64 the metapackage points at, with the exact
        version it pins (`apt-get download` of the metapackage alone fetches no kernel)."""
        meta = self.show(KERNEL_META_PACKAGE, BUSYBOX_PACKAGE)[KERNEL_META_PACKAGE]
        depends = meta.get("Depends", "")
        for alternative in depends.replace("|", ",").split(","):
            name, _, constraint = alternative.strip().partition(" ")
            if not name.startswith("linux-image-"):
                continue
            if constraint.startswith("(= ") and constraint.endswith(")"):
                return name, constraint[3:-1].strip()
            return name, self.candidate_version(name)
        raise KernelError(f"{KERNEL_META_PACKAGE} depends on no linux-image package: {depends}")

    def download_and_unpack(self, package: str, dest: Path, say: Progress) -> Path:
        dest.mkdir(parents=True, exist_ok=True)
        say(f"apt-get download {package}")
        self._run(
            ["apt-get", *self.options, "-q", "download", package],
            f"apt-get download {package}",
            cwd=dest,
        )
        debs = sorted(dest.glob(f"{package}_*.deb"))
        if not debs:
            raise KernelError(f"apt-get download {package} produced no .deb")
        tree = dest / "tree"
        self._run(["dpkg-deb", "-x", str(debs[0]), str(tree)], f"dpkg-deb -x {debs[0].name}")
        return tree


# -- small helpers -----------------------------------------------------------------------------


def _operator_kernel(path: Path, settings: Settings, say: Progress) -> Path:
    if not path.is_file():
        raise KernelError(f"AAMP_FIRECRACKER_KERNEL={path} is not a file")
    with path.open("rb") as fh:
        if fh.read(4) == ELF_MAGIC:
            return path
    stat = path.stat()
    target = (
        kernel_cache_dir(settings) / "operator" / f"{path.name}-{stat.st_size}-{int(stat.st_mtime)}"
    )
    if not _is_elf(target):
        say(f"extracting vmlinux from {path}")
        _atomic_write(target, bzimage_to_vmlinux(path.read_bytes()))
    return target


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == ELF_MAGIC
    except OSError:
        return False


def _atomic_write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: v.strip('"') for k, v in pairs}


__all__ = [
    "GuestKernel",
    "KernelError",
    "bzimage_to_vmlinux",
    "ensure_guest_kernel",
    "ensure_initrd",
    "ensure_kernel",
]
