"""Fixtures for the SDK's tests: `live`, a real `aamp up` (conftest_live.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest_live import live, module_live, shared_live  # noqa: F401
