"""Fixtures for run tests: a real in-process control plane (store, audit log, vault, gVisor
sandboxes from the built `base` image) and helpers to define agents and follow runs."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "api"), str(HERE.parent / "agents")]

from api_plane import Plane, booting_plane_settings, running_plane  # noqa: E402


@pytest.fixture
async def run_plane(tmp_path: Path, base_image) -> AsyncIterator[Plane]:
    async with running_plane(booting_plane_settings(tmp_path)) as plane:
        assert plane.cp.runs is not None
        yield plane
