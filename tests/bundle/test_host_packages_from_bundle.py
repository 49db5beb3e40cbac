"""The install's Debian-packages step really installs the host's packages from a bundle, on a
system that lacks them, with no network: a minimal Debian (debootstrap --variant=minbase from
the bundle's own repository, cached by the content of that repository's index) gets an
overlay of its own, and inside a mount and network namespace (only loopback) that system
runs `scripts/install-host-packages --bundle`, apt reading nothing but the bundle. Every
package of scripts/host-packages is then installed there; this host's own dpkg status is
unchanged (the packages go into the overlay, never onto the host).

The base system is bookworm as the image builds bootstrap it, older than what the host suite
carries (its updates and security suites), so apt upgrades some of it on the way, as on a
target installed from older media.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from real_bundle import REPO, bundle_cache  # tests/bundle/real_bundle.py

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
GUEST_INDEX = "debian/dists/bookworm/main/binary-amd64/Packages"
# Services do not start inside the test's system (no init runs there), and dpkg does not
# fsync each file of a throwaway overlay: what any chroot build does.
POLICY_RC_D = "#!/bin/sh\nexit 101\n"
DPKG_UNSAFE_IO = "force-unsafe-io\n"


def host_packages() -> list[str]:
    lines = (REPO / "scripts/host-packages").read_text().splitlines()
    return [s for s in (line.split("#", 1)[0].strip() for line in lines) if s]


def netless(script: str, timeout: float) -> subprocess.CompletedProcess:
    """bash `script` in new mount and network namespaces: only loopback, mounts its own."""
    return subprocess.run(
        ["unshare", "--net", "--mount", "--propagation", "private",
         "bash", "-euo", "pipefail", "-c",
         'ip link set lo up; [ "$(ip -o link | wc -l)" -eq 1 ]; ' + script],
        capture_output=True,
        text=True,
        timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="session")
def minimal_debian(made_bundle, tmp_path_factory) -> Path:
    """A minbase bookworm tree bootstrapped offline from the bundle, kept by the content of
    the index it came from (never written to: each test lays an overlay over it)."""
    bundle, _pub = made_bundle
    index = hashlib.sha256((bundle / GUEST_INDEX).read_bytes()).hexdigest()[:16]
    base = bundle_cache(tmp_path_factory) / "bundle-systems"
    root = base / index
    if (root / "var/lib/dpkg/status").is_file():
        return root
    partial = base / f"{index}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    made = netless(
        f"debootstrap --variant=minbase --no-check-gpg --components=main bookworm {partial} "
        f"file://{bundle}/debian",
        timeout=1800,
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    partial.rename(root)
    return root


def _installed(listing: str) -> set[str]:
    return {line.split()[0] for line in listing.splitlines() if line.endswith(" installed")}


def dpkg_installed(root: Path) -> set[str]:
    done = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W",
         "-f=${Package} ${db:Status-Status}\n"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return _installed(done.stdout)


def test_the_host_packages_install_from_the_bundle_with_no_network(
    made_bundle, minimal_debian: Path, tmp_path: Path
) -> None:
    bundle, _pub = made_bundle
    wanted = host_packages()
    lacking = [p for p in wanted if p not in dpkg_installed(minimal_debian)]
    assert {"runsc", "chromium", "postgresql", "python3-venv"} <= set(lacking), lacking
    host_status = hashlib.sha256(Path("/var/lib/dpkg/status").read_bytes()).hexdigest()
    upper, work, root = tmp_path / "upper", tmp_path / "work", tmp_path / "root"
    after = tmp_path / "installed.txt"
    for d in (upper, work, root):
        d.mkdir()
    try:
        done = netless(
            f"mount -t overlay overlay -o lowerdir={minimal_debian},upperdir={upper},"
            f"workdir={work} {root}\n"
            f"mount -t proc proc {root}/proc\n"
            f"mkdir -p {root}{bundle} {root}/opt/aamp/scripts\n"
            f"mount --bind -o ro {bundle} {root}{bundle}\n"
            f"mount --bind -o ro {REPO}/scripts {root}/opt/aamp/scripts\n"
            f"printf '{POLICY_RC_D}' > {root}/usr/sbin/policy-rc.d\n"
            f"chmod +x {root}/usr/sbin/policy-rc.d\n"
            f"printf '{DPKG_UNSAFE_IO}' > {root}/etc/dpkg/dpkg.cfg.d/aamp-test\n"
            f"chroot {root} /opt/aamp/scripts/install-host-packages --bundle {bundle}\n"
            # The step again: everything is there, so it has nothing to do.
            f"chroot {root} /opt/aamp/scripts/install-host-packages --bundle {bundle}\n"
            f"chroot {root} runsc --version\n"
            f"chroot {root} python3 -m venv /tmp/venv\n"
            f"chroot {root} dpkg-query -W -f='${{Package}} ${{db:Status-Status}}\\n' > {after}\n",
            timeout=2400,
        )
        assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
        assert "Debian packages from the bundle: " + " ".join(lacking) in done.stdout
        assert done.stdout.count("==> Debian packages") == 1, done.stdout[-3000:]
        assert "runsc version" in done.stdout, done.stdout[-2000:]
        # What the overlay's system now has: every host package, installed.
        now = _installed(after.read_text())
        assert [p for p in wanted if p not in now] == []
        assert hashlib.sha256(Path("/var/lib/dpkg/status").read_bytes()).hexdigest() == host_status
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
