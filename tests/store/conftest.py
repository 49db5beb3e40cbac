"""Both backends for every store test: a SQLite file, and a real PostgreSQL server started here.

(The server and the `database_url` parameter come from tests/conftest.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aamp.config import Settings
from aamp.store import Store


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    home = tmp_path / "home"
    return Settings(
        home=home,
        runtime_dir=tmp_path / "run",
        image_dir=home / "images",
        env={"AAMP_DATABASE_URL": database_url},
    )


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    s = Store.open(settings)
    yield s
    s.close()
