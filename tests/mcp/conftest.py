"""The MCP tests use the SDK tests' `live` control plane (a real `aamp up`, tests/sdk)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / p) for p in ("sdk", "api", "agents", "runs")]

from conftest_live import live, module_live, shared_live  # noqa: E402,F401
