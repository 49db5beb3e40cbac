"""Fixtures for run tests: a real in-process control plane (store, audit log, vault, gVisor
sandboxes from the built `base` image) and helpers to define agents and follow runs."""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from install_layout import shared_image_dir  # tests/install_layout.py

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "api"), str(HERE.parent / "agents")]

from api_plane import Plane, gvisor_only, plane_settings  # noqa: E402

from aamp.api.app import create_app  # noqa: E402
from aamp.server import build_control_plane  # noqa: E402


@pytest.fixture
async def run_plane(tmp_path: Path, base_image) -> AsyncIterator[Plane]:
    images = str(shared_image_dir())
    settings = plane_settings(tmp_path, AAMP_IMAGE_DIR=images)
    cp, _ = build_control_plane(settings, gvisor_only(settings))  # type: ignore[arg-type]
    assert cp.runs is not None
    cp.runs.model_backoff = 0.05
    app = create_app(cp)
    token = settings.cli_token_path.read_text().strip()
    try:
        async with app.router.lifespan_context(app):
            yield Plane(cp, app, token)
    finally:
        cp.store.close()
        shutil.rmtree(settings.runtime_dir, ignore_errors=True)
