"""Where the slow bundle tests keep what they make once: the real bundle (scripts/bundle, once
per content key: what decides its contents) under AAMP_DOWNLOAD_CACHE/bundles, outside any
clone, signed with a key kept beside it (the fixture is in conftest.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What decides a bundle's contents: a cached one is reused only while these are unchanged.
BUNDLE_INPUTS = (
    "scripts/host-packages",
    "requirements.lock",
    "pyproject.toml",
    "src/aamp/bundle/create.py",
    "src/aamp/bundle/debian.py",
    "src/aamp/sandbox/image_recipes.py",
    "src/aamp/sandbox/browser_quiet.py",
    "src/aamp/sandbox/kernel_packages.py",
    "src/aamp/sandbox/firecracker_wheel.py",
)


# The site's wheelhouse list the bundle carries (scripts/bundle --wheelhouse).
WHEELHOUSE_LIST = "# the site's policies use these\ntabulate==0.9.0\n"


def bundle_key() -> str:
    digest = hashlib.sha256(WHEELHOUSE_LIST.encode() + b"\0")
    for rel in BUNDLE_INPUTS:
        digest.update(rel.encode() + b"\0" + (REPO / rel).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def bundle_cache(tmp_path_factory) -> Path:
    cache = os.environ.get("AAMP_DOWNLOAD_CACHE")
    return Path(cache) if cache else tmp_path_factory.mktemp("downloads")
