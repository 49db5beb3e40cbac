"""The `live` fixture of the SDK and MCP tests: a real `aamp up` process (tests/api/test_cli.py's
`ControlPlane`) with gVisor and the built `base` image, its admin's URL and token, and a
config directory of the test's own for login profiles (never the user's)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / p) for p in ("api", "agents", "runs")]

from test_cli import ControlPlane  # noqa: E402


@pytest.fixture
def live(settings, tmp_path: Path, base_image) -> Iterator[ControlPlane]:
    """A running control plane; `live.url`, `live.admin_token`; its CLI gets a config
    directory of its own (XDG_CONFIG_HOME), so no profile of the machine's user is read."""
    plane = ControlPlane(settings, {"XDG_CONFIG_HOME": str(tmp_path / "config")})
    plane.start()
    plane.url = f"http://127.0.0.1:{plane.port}"
    plane.admin_token = settings.cli_token_path.read_text().strip()
    try:
        yield plane
    finally:
        plane.stop()
