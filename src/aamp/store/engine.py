"""Engines with the durability and locking behaviour the audit log and vault rely on.

SQLite: WAL journal (readers never block the writer), `synchronous=FULL` (a commit returns only
once the WAL is fsynced, so an acknowledged audit record survives a crash or power loss),
foreign keys on, and a busy timeout so several processes can share the file. pysqlite's own
transaction handling is switched off and `BEGIN` is emitted here, so that a connection opened
with `execution_options(write_lock=True)` starts with `BEGIN IMMEDIATE` and takes the database
write lock before reading anything it will write back (the audit head, the vault rows).

PostgreSQL: psycopg 3; `synchronous_commit` forced on for our sessions whatever the server's
default, so that COMMIT means durable. Cross-process serialisation is done with row locks
(`SELECT ... FOR UPDATE`) by the callers that need it. A pooled connection is pinged before
use only when it has sat idle for `PING_IF_IDLE_S` (a server restart or a firewall dropping
idle connections is then noticed, and the pool reconnects, before a request fails); a
connection in steady use is not pinged on every checkout, which cost every API request a
round trip.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import URL

WRITE_LOCK = "write_lock"
SQLITE_BUSY_TIMEOUT_MS = 30_000
PING_IF_IDLE_S = 5.0
# PostgreSQL connections per process: one per `Store.run` thread (store.py), plus overflow
# for the audit writer and the odd burst. Several replicas share the server's max_connections.
POOL_SIZE = 12
MAX_OVERFLOW = 8
_IDLE_SINCE = "aamp_idle_since"

# Every PostgreSQL connection of ours (the pool's and `ReadPlanPool`'s) is opened with these.
PG_OPTIONS = "-c synchronous_commit=on -c timezone=UTC"


def create_store_engine(url: URL, *, pool_size: int = POOL_SIZE) -> Engine:
    """An engine for `url` (already normalised by `aamp.store.url`)."""
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=MAX_OVERFLOW,
        connect_args={"options": PG_OPTIONS},
    )
    _ping_idle_connections(engine)
    return engine


def _ping_idle_connections(engine: Engine) -> None:
    """SQLAlchemy's pessimistic pre-ping, for connections idle long enough to have gone stale."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.pop(_IDLE_SINCE, None)
        if idle_since is None or time.monotonic() - idle_since < PING_IF_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as err:
            # The pool drops every connection older than now and retries with a fresh one.
            raise exc.InvalidatePoolError(str(err)) from err


def _enable_wal(cur: sqlite3.Cursor) -> None:
    """`PRAGMA journal_mode=WAL`, retried while another connection holds the lock.

    Switching a new database file to WAL needs an exclusive lock, and SQLite answers "database
    is locked" at once instead of waiting out the busy timeout; several processes opening one
    new installation at the same moment then failed at random.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def prepare_sqlite(dbapi_conn: sqlite3.Connection) -> None:
    """What every SQLite connection of ours is set to, the engine's and `LoopReader`'s."""
    # Autocommit at the driver level: we emit BEGIN ourselves (see module docstring).
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    try:
        _enable_wal(cur)
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cur.close()


def open_sqlite(url: URL) -> sqlite3.Connection:
    """A connection of our own to the SQLite file of `url`, outside the engine's pool."""
    conn = sqlite3.connect(
        url.database or "",
        timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
        check_same_thread=False,  # used by one thread; may be closed by another
    )
    prepare_sqlite(conn)
    return conn


def _sqlite_engine(url: URL) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        prepare_sqlite(dbapi_conn)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(WRITE_LOCK, False)
        # Straight to the driver: through `exec_driver_sql` this one word cost as much CPU as
        # the query it precedes.
        conn.connection.dbapi_connection.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine
