"""The `plane` fixture: an in-process control plane for API tests (see api_plane.py)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from api_plane import Plane, gvisor_only, plane_settings

from aamp.api.app import create_app
from aamp.server import build_control_plane


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    settings = plane_settings(tmp_path)
    cp, _ = build_control_plane(settings, gvisor_only(settings))  # type: ignore[arg-type]
    app = create_app(cp)
    token = settings.cli_token_path.read_text().strip()
    try:
        async with app.router.lifespan_context(app):
            yield Plane(cp, app, token)
    finally:
        cp.store.close()
        shutil.rmtree(settings.runtime_dir, ignore_errors=True)
