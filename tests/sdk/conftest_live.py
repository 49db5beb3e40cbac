"""The `live` fixture of the SDK and MCP tests: a real `aamp up` process (tests/api/test_cli.py's
`ControlPlane`) with gVisor and the built `base` image, its admin's URL and token, and a
config directory of the test's own for login profiles (never the user's).

`shared_live` is the same, one plane for a whole module (starting one costs seconds): a module
whose tests make only names of their own uses it as its `live`; each of its tests begins with
no sandbox on the plane (test_cli.py's `leaves_no_sandbox`)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / p) for p in ("api", "agents", "runs")]

from installation_settings import make_settings  # noqa: E402  (tests/installation_settings.py)
from test_cli import ControlPlane, leaves_no_sandbox  # noqa: E402


def _running(settings, config: Path) -> Iterator[ControlPlane]:
    plane = ControlPlane(settings, {"XDG_CONFIG_HOME": str(config)})
    plane.start()
    plane.url = f"http://127.0.0.1:{plane.port}"
    plane.admin_token = settings.cli_token_path.read_text().strip()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def live(settings, tmp_path: Path, base_image) -> Iterator[ControlPlane]:
    """A running control plane; `live.url`, `live.admin_token`; its CLI gets a config
    directory of its own (XDG_CONFIG_HOME), so no profile of the machine's user is read."""
    yield from _running(settings, tmp_path / "config")


@pytest.fixture(scope="module")
def module_live(tmp_path_factory, base_image) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("live")
    settings = make_settings(work / "home")
    try:
        yield from _running(settings, work / "config")
    finally:
        shutil.rmtree(settings.runtime_dir, ignore_errors=True)


@pytest.fixture
def shared_live(module_live: ControlPlane) -> Iterator[ControlPlane]:
    with leaves_no_sandbox(module_live):
        yield module_live
