"""Settings of a fresh installation for a test, reusing the guest images `scripts/install`
built (install_layout.py); what `conftest.py`'s `settings` fixture and the module-wide planes
(`sandbox/gvisor_plane.py`) both build on."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from install_layout import shared_image_dir

from aamp.config import Settings


def shared_env() -> dict[str, str]:
    return {
        "AAMP_IMAGE_DIR": str(shared_image_dir()),
        "AAMP_DOWNLOAD_CACHE": os.environ.get("AAMP_DOWNLOAD_CACHE") or "/var/cache/aamp/downloads",
    }


def make_settings(home: Path, **extra: str) -> Settings:
    env = {
        **shared_env(),
        "AAMP_HOME": str(home),
        "AAMP_RUNTIME_DIR": f"/run/aamp-t{secrets.token_hex(4)}",
        **extra,
    }
    return Settings.from_env(env)
