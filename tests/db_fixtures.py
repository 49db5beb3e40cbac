"""Fixtures for tests that need a store: each runs on a SQLite file and on a database of the
real PostgreSQL server from tests/conftest.py (`database_url` is parametrised there).

A test folder uses them with `from db_fixtures import settings, store  # noqa: F401` in its
conftest; `settings` then replaces the root conftest's sandbox-oriented one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
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


@pytest.fixture
async def audit(settings: Settings, store: Store) -> AsyncIterator[object]:
    from aamp.audit import AuditLog

    async with AuditLog.open(settings, store) as log:
        yield log
