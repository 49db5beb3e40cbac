"""Engines with the durability and locking behaviour the audit log and vault rely on.

SQLite: WAL journal (readers never block the writer), `synchronous=FULL` (a commit returns only
once the WAL is fsynced, so an acknowledged audit record survives a crash or power loss),
foreign keys on, and a busy timeout so several processes can share the file. pysqlite's own
transaction handling is switched off and `BEGIN` is emitted here, so that a connection opened
with `execution_options(write_lock=True)` starts with `BEGIN IMMEDIATE` and takes the database
write lock before reading anything it will write back (the audit head, the vault rows).

PostgreSQL: psycopg 3; `synchronous_commit` forced on for our sessions whatever the server's
default, so that COMMIT means durable. Cross-process serialisation is done with row locks
(`SELECT ... FOR UPDATE`) by the callers that need it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL

WRITE_LOCK = "write_lock"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def create_store_engine(url: URL, *, pool_size: int = 5) -> Engine:
    """An engine for `url` (already normalised by `aamp.store.url`)."""
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=10,
        pool_pre_ping=True,
        connect_args={"options": "-c synchronous_commit=on -c timezone=UTC"},
    )
    return engine


def _sqlite_engine(url: URL) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Autocommit at the driver level: we emit BEGIN ourselves (see module docstring).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(WRITE_LOCK, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine
