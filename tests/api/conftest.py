"""The `plane` fixture: an in-process control plane for API tests (see api_plane.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from api_plane import Plane, plane_settings, running_plane


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    settings = plane_settings(tmp_path)
    async with running_plane(settings) as plane:
        yield plane
