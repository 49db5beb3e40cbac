"""The whole air-gapped path, as the issue states it: make a bundle (cached outside the clone,
keyed by what decides its contents), then inside a network namespace with only loopback, from
a fresh `git clone`, `scripts/install --bundle --trust` succeeds, `aamp up` starts, a one-shot
sandbox prints 42 and an agent run with the scripted model succeeds; `aamp doctor` says
offline-complete, and the site's wheelhouse package the bundle carries is in the wheelhouse.
Then an upgrade: a newer clone (its browser recipe changed) installed from
the bundle over the same $AAMP_HOME keeps users, agents, runs, secrets, keys and CA, rebuilds
only the browser image, keeps the wheelhouse, and `aamp audit verify` passes.

This host already has every Debian package of scripts/host-packages, so here the install's
Debian step has nothing to do (installing for real would change a shared machine); apt is run
against the bundle's repository alone with an empty dpkg status (`--simulate`), and the
host's dpkg status is checked unchanged. The real installation of those packages, on a
minimal system that lacks them, is test_host_packages_from_bundle.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline(script: str, cwd: Path, env: dict[str, str], timeout: float = 2400):
    """Run bash `script` in a new network namespace holding only loopback."""
    return subprocess.run(
        [
            "unshare",
            "--net",
            "bash",
            "-euo",
            "pipefail",
            "-c",
            'ip link set lo up; [ "$(ip -o link | wc -l)" -eq 1 ]; ' + script,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def scenario(done: subprocess.CompletedProcess) -> dict:
    line = next((x for x in done.stdout.splitlines() if x.startswith("SCENARIO ")), None)
    assert line is not None, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(line.removeprefix("SCENARIO "))


def images(image_dir: Path) -> dict[str, set[str]]:
    return {
        d.name: {h.name for h in d.iterdir() if h.is_dir() and len(h.name) == 64}  # builds
        for d in image_dir.iterdir()
        if d.is_dir()
    }


def test_offline_install_from_a_bundle_then_an_upgrade(made_bundle, tmp_path: Path) -> None:
    bundle, pub = made_bundle
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    home, image_dir, work = tmp_path / "home", tmp_path / "images", tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "AAMP_"))}
    env.pop("PYTHONPATH", None)
    env.update(
        AAMP_HOME=str(home),
        AAMP_IMAGE_DIR=str(image_dir),
        AAMP_PORT=str(free_port()),
        AAMP_DRIVER="gvisor",
        AAMP_BUNDLE=str(bundle),
        AAMP_ADMIN_PASSWORD="offline-install-password",
    )
    shutil.copy(REPO / "tests/bundle/offline_scenario.py", work / "offline_scenario.py")
    dpkg_status = sha256(Path("/var/lib/dpkg/status"))

    # apt, pointed at the bundle alone, can install every host package on an empty system.
    apt_dir = tmp_path / "apt"
    (apt_dir / "lists/partial").mkdir(parents=True)
    (apt_dir / "parts").mkdir()
    (apt_dir / "status").touch()
    (apt_dir / "sources.list").write_text(f"deb [trusted=yes] file://{bundle}/debian host main\n")
    opts = (
        f"-o Dir::Etc::SourceList={apt_dir}/sources.list -o Dir::Etc::SourceParts={apt_dir}/parts "
        f"-o Dir::State::Lists={apt_dir}/lists -o Dir::State::status={apt_dir}/status "
        f"-o Dir::Cache={apt_dir}/cache -o Debug::NoLocking=1 -o APT::Sandbox::User=root"
    )
    host_packages = " ".join(
        line.split("#")[0].strip()
        for line in (REPO / "scripts/host-packages").read_text().splitlines()
        if line.split("#")[0].strip()
    )
    apt = offline(
        f"mkdir -p {apt_dir}/cache/archives/partial; apt-get {opts} -q update; "
        f"apt-get {opts} -s -q --no-install-recommends install {host_packages}",
        clone,
        env,
        timeout=600,
    )
    assert apt.returncode == 0, apt.stdout[-3000:] + apt.stderr[-3000:]
    assert "Inst runsc " in apt.stdout and "Inst chromium " in apt.stdout

    began = time.monotonic()
    # The local model's build rides along when the bundle was made where it had been built.
    local_model = any((bundle / "wheels/local-model").glob("llama_cpp_python-*.whl"))
    installed = offline(
        f"scripts/install --bundle {bundle} --trust {pub} && "
        + ("scripts/install-local-model && .venv/bin/aamp model path && " if local_model else "")
        + f".venv/bin/python {work}/offline_scenario.py first {work}",
        clone,
        env,
    )
    print(f"offline install + scenario: {time.monotonic() - began:.0f}s")
    assert installed.returncode == 0, installed.stdout[-5000:] + installed.stderr[-5000:]
    assert "bundle verified:" in installed.stdout and "signature checked with" in installed.stdout
    first = scenario(installed)
    if local_model:
        assert "smollm2" in installed.stdout.lower(), installed.stdout[-3000:]
    assert "offline-complete" in first["doctor"]["out"], first["doctor"]
    assert first["sandbox"]["rc"] == 0 and first["sandbox"]["out"].strip() == "42", first["sandbox"]
    for step in first["setup"]:
        assert step["rc"] == 0, step
    assert first["run"]["rc"] == 0 and "run succeeded" in first["run"]["out"], first["run"]
    assert sha256(Path("/var/lib/dpkg/status")) == dpkg_status  # the host's packages untouched
    # The site's wheelhouse list rode along: its wheel is in the wheelhouse, bytes as listed.
    tabulate = "tabulate-0.9.0-py3-none-any.whl"
    assert tabulate in first["wheelhouse"]["out"], first["wheelhouse"]
    kept_wheels = json.loads((home / "wheelhouse/index.json").read_text())
    listed = json.loads((bundle / "manifest.json").read_text())["files"]
    assert kept_wheels[tabulate]["sha256"] == listed[f"wheels/wheelhouse/{tabulate}"]["sha256"]

    # The upgrade: a newer clone whose browser recipe changed, over the same $AAMP_HOME.
    kept = {
        p: sha256(home / p)
        for p in ("vault-master.key", "audit-signing.key", "ca/ca.crt", "ca/ca.key")
        if (home / p).is_file()
    }
    assert len(kept) == 4, sorted(p.name for p in home.rglob("*"))
    before = images(image_dir)
    recipes = clone / "src/aamp/sandbox/image_recipes.py"
    recipes.write_text(
        recipes.read_text().replace(
            "files=browser_quiet.FILES,",
            'files=(*browser_quiet.FILES, ("etc/aamp-upgrade", "2\\n")),',
        )
    )
    subprocess.run(
        ["git", "-C", str(clone), "commit", "-qam", "browser recipe: a new file"],
        check=True,
        env={
            **env,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    )
    upgraded = offline(
        f"scripts/install --bundle {bundle} --trust {pub} && "
        f".venv/bin/python {work}/offline_scenario.py again {work}",
        clone,
        env,
    )
    assert upgraded.returncode == 0, upgraded.stdout[-5000:] + upgraded.stderr[-5000:]
    again = scenario(upgraded)
    after = images(image_dir)
    assert after["base"] == before["base"], (before, after)  # not rebuilt
    assert len(after["browser"]) == 1 and after["browser"] != before["browser"], (before, after)
    assert {p: sha256(home / p) for p in kept} == kept  # keys and CA kept
    assert "alice" in again["users"]["out"], again["users"]
    assert "reporter" in again["agents"]["out"], again["agents"]
    assert "succeeded" in again["runs"]["out"], again["runs"]
    assert "kept_secret" in again["secrets"]["out"], again["secrets"]
    assert tabulate in again["wheelhouse"]["out"], again["wheelhouse"]
    assert again["sandbox"]["out"].strip() == "42", again["sandbox"]
    assert again["audit"]["rc"] == 0, again["audit"]
