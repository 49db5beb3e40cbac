"""Fixtures for the UI tests: a control plane that boots nothing (tests/api/api_plane.py), the
whole site (API + UI) in front of it, and browser-like clients that sign in through the login
form and keep their cookies."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "api"), str(HERE.parent / "agents"), str(HERE.parent / "runs")]

from api_plane import plane_settings, running_plane  # noqa: E402
from web_helpers import Site  # noqa: E402


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    async with running_plane(plane_settings(tmp_path)) as plane:
        yield Site(plane)
