"""A sandbox's driver record: the small JSON file in its state directory that lets destroy and
reap find what a driver started, from disk alone, after a crash too.

Written atomically (a temporary file, then a rename), so a reader sees the old record or the
new one, never half of one; an unreadable or non-object record reads as none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write(state_dir: Path, name: str, record: dict[str, Any]) -> None:
    tmp = state_dir / f".{name}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, state_dir / name)


def read(state_dir: Path, name: str) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / name).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
