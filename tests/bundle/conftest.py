"""The real bundle the slow bundle tests share (real_bundle.py): a cached one is verified once
a session before it is used (hashing only files changed since the last session), else
scripts/bundle makes it. And for the fast tests, `bundle`: a copy of the module's own
`pristine` synthetic bundle (made once a module), to tamper with, and its `keys`."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from real_bundle import REPO, WHEELHOUSE_LIST, bundle_cache, bundle_key  # real_bundle.py

from aamp.bundle import manifest


@pytest.fixture(scope="session")
def made_bundle(tmp_path_factory) -> tuple[Path, Path]:
    """(bundle, trusted public key): made once per content key, under AAMP_DOWNLOAD_CACHE."""
    base = bundle_cache(tmp_path_factory) / "bundles"
    bundle = base / bundle_key()
    key, pub = base / f"{bundle.name}.key.pem", base / f"{bundle.name}.pub.pem"
    try:
        if bundle.is_dir():
            # Hashes only what changed since the last session's check (the install, in the
            # test, hashes every byte again itself).
            manifest.verify(bundle, trust=pub, seen=base / f"{bundle.name}.verified.json")
            return bundle, pub
    except manifest.BundleRefused:
        shutil.rmtree(bundle)
    base.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True)
    partial = base / f"{bundle.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    listed = base / f"{bundle.name}.wheelhouse.txt"
    listed.write_text(WHEELHOUSE_LIST)
    began = time.monotonic()
    done = subprocess.run(
        [
            str(REPO / "scripts/bundle"),
            str(partial),
            "--sign",
            str(key),
            "--wheelhouse",
            str(listed),
        ],
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(done.stdout[-1500:], f"(made in {time.monotonic() - began:.0f}s)")
    partial.rename(bundle)
    return bundle, pub


@pytest.fixture
def keys(pristine) -> tuple[Path, Path]:
    return pristine[1]


@pytest.fixture
def bundle(pristine, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine[0], tmp_path / "bundle"))
