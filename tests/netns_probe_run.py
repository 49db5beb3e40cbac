"""Running a probe script inside a private network namespace (`unshare -n`: its only interface
is `lo`), with an installation of its own that reuses the shared guest images; the probe
prints one JSON report as its last line, which is returned."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from install_layout import REPO, shared_image_dir


def run_probe(
    probe: Path, home: Path, args: list[str], *, timeout: int, **env: str
) -> dict[str, Any]:
    """Run `probe SETTINGS_JSON *args` under `unshare -n`; `env` adds settings."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare (util-linux) and root")
    runtime = f"/run/aamp-t{secrets.token_hex(4)}"
    settings = {
        "AAMP_HOME": str(home),
        "AAMP_RUNTIME_DIR": runtime,
        "AAMP_IMAGE_DIR": str(shared_image_dir()),
        **env,
    }
    try:
        done = subprocess.run(
            ["unshare", "-n", sys.executable, str(probe), json.dumps(settings), *args],
            capture_output=True,
            timeout=timeout,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    return json.loads(done.stdout.decode().strip().splitlines()[-1])
