"""Where `scripts/install` put this installation, so tests reuse its guest images and CA.

AAMP_HOME and AAMP_IMAGE_DIR when set (CI keeps both outside the clone), else the clone's own
`.aamp`. Images are keyed by content hash, so a reused one is always what the code would build.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def shared_home() -> Path:
    return Path(os.environ.get("AAMP_HOME") or REPO / ".aamp").resolve()


def shared_image_dir() -> Path:
    return Path(os.environ.get("AAMP_IMAGE_DIR") or shared_home() / "images").resolve()
