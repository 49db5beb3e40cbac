"""The CLI's tests use the client tests' scripted HTTP server (tests/client/scripted_http.py)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "client")]
