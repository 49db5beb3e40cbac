"""The store: engine behaviour on both backends, URL handling, migrations to head."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pgtemp import TemporaryPostgres
from sqlalchemy import text

from aamp.config import Settings
from aamp.store import DatabaseConfigError, Store, database_url, migrate
from aamp.store.tables import metadata
from aamp.store.url import normalise_url


def test_sqlite_is_the_default_under_home(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "h", runtime_dir=tmp_path / "r", image_dir=tmp_path / "i")
    with Store.open(settings) as store:
        assert store.dialect == "sqlite"
        assert (tmp_path / "h" / "aamp.db").is_file()
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_postgresql_commits_synchronously(postgres_server: TemporaryPostgres) -> None:
    url = postgres_server.create_database("sync_check")
    with Store.from_url(url) as store:
        assert store.dialect == "postgresql"
        with store.engine.connect() as conn:
            assert conn.execute(text("SHOW synchronous_commit")).scalar() == "on"


def test_migrations_reach_head_and_match_the_models(store: Store) -> None:
    assert migrate.current_revision(store.engine) == migrate.head_revision()
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


def test_opening_again_is_a_no_op(settings: Settings) -> None:
    with Store.open(settings) as first, first.write_connection() as conn:
        conn.execute(text("UPDATE audit_head SET seq = 7 WHERE id = 1"))
    with Store.open(settings) as again, again.engine.connect() as conn:
        assert conn.execute(text("SELECT seq FROM audit_head")).scalar() == 7


def test_concurrent_start_ups_migrate_once(database_url: str) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            Store.from_url(database_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with Store.from_url(database_url, upgrade=False) as store:
        assert migrate.current_revision(store.engine) == migrate.head_revision()
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM audit_head")).scalar() == 1


def test_database_url_from_settings(tmp_path: Path) -> None:
    s = Settings(
        home=tmp_path,
        runtime_dir=tmp_path,
        image_dir=tmp_path,
        env={"AAMP_DATABASE_URL": "postgres://u:hunter2@db.example:5433/aamp"},
    )
    url = database_url(s)
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port, url.database) == ("db.example", 5433, "aamp")
    assert "hunter2" not in repr(url)
    assert "hunter2" not in repr(Store(__import__("sqlalchemy").create_engine(url)))


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("mysql://u@h/db", "unsupported database 'mysql'"),
        ("sqlite://", "must name an SQLite file"),
        ("sqlite:///:memory:", "must name an SQLite file"),
        ("not a url", "is not a database URL"),
    ],
)
def test_bad_database_urls_are_named(raw: str, fragment: str) -> None:
    with pytest.raises(DatabaseConfigError, match="AAMP_DATABASE_URL") as info:
        normalise_url(raw)
    assert fragment in str(info.value)
