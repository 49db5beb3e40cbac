"""Every store test here runs on both backends: a SQLite file and a real PostgreSQL server.
The control-plane tests use the API's and the runs' helpers (`api_plane`, `run_helpers`)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / d) for d in ("api", "agents", "runs")]

from db_fixtures import audit, settings, store  # noqa: E402, F401  (fixtures)
