"""`Store`: the engine of one installation, migrated, plus the few ways code reaches it.

The engine is synchronous SQLAlchemy on purpose: the audit writer runs its batches in a
dedicated thread, and async callers use `await store.run(fn, ...)`, which runs `fn(session)`
in a worker thread. That keeps one driver per backend (pysqlite, psycopg 3) and no greenlet
magic between the event loop and the database.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from aamp.config import Settings
from aamp.store import migrate
from aamp.store.engine import POOL_SIZE, WRITE_LOCK, create_store_engine
from aamp.store.url import database_url, normalise_url

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

QUICK_READ_ATTR = "__aamp_quick_read__"
# Threads for `Store.run`: database work is mostly waiting (for the server, for a lock, for the
# GIL), so more threads than cores; asyncio's default pool (cores + 4 = 6 here) queued an API
# request behind others for tens of ms. The PostgreSQL pool is sized to match (engine.py).
STORE_THREADS = POOL_SIZE


def quick_read(fn: F) -> F:
    """Mark a store function as a few indexed reads and nothing else (no writes, no locks, no
    slow hashing), which `Store.run` may then run without a thread hop (see there)."""
    setattr(fn, QUICK_READ_ATTR, True)
    return fn


class Store:
    """One database: engine, sessions, write transactions. Close it when done."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._inline_quick_reads = engine.dialect.name == "sqlite"
        self._executor = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="aamp-store")

    @classmethod
    def open(cls, settings: Settings, *, upgrade: bool = True) -> Store:
        """The installation's store, its schema brought to the newest revision."""
        url = database_url(settings)
        if url.get_backend_name() == "sqlite" and url.database:
            parent = os.path.dirname(url.database)
            if parent:
                os.makedirs(parent, mode=0o700, exist_ok=True)
        return cls.from_url(url, upgrade=upgrade)

    @classmethod
    def from_url(cls, url: str | URL, *, upgrade: bool = True) -> Store:
        url = normalise_url(url) if isinstance(url, str) else url
        store = cls(create_store_engine(url))
        if upgrade:
            try:
                migrate.upgrade(store.engine)
            except BaseException:
                store.close()
                raise
        return store

    @property
    def dialect(self) -> str:
        """`"sqlite"` or `"postgresql"`."""
        return self.engine.dialect.name

    def session(self) -> Session:
        """A new ORM session (use as a context manager; commit explicitly)."""
        return self._sessions()

    @contextmanager
    def write_session(self) -> Iterator[Session]:
        """A session whose transaction holds the write lock from its first statement.

        On SQLite that is `BEGIN IMMEDIATE` (no "database is locked" half-way through a
        read-modify-write); on PostgreSQL callers lock the rows they change with FOR UPDATE.
        Commits on success, rolls back on error.
        """
        with (
            self.engine.connect().execution_options(**{WRITE_LOCK: True}) as conn,
            Session(bind=conn, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session

    @contextmanager
    def read_connection(self) -> Iterator[Connection]:
        """A Core connection for a few reads on the hot path (authentication, lookups); its
        driver connection may be used directly (`conn.connection.driver_connection`).

        SQLite: one deferred read transaction, so all its reads see one snapshot (WAL readers
        never wait for the writer). PostgreSQL: autocommit, so a read costs one round trip
        instead of BEGIN, the query and ROLLBACK; at PostgreSQL's READ COMMITTED each statement
        sees its own snapshot either way, so nothing a caller could observe changes.
        """
        conn = self.engine.connect()
        try:
            if self.dialect == "postgresql":
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            else:
                conn.begin()  # also for reads made on the driver's own cursor
            yield conn
        finally:
            conn.close()

    @contextmanager
    def write_connection(self) -> Iterator[Connection]:
        """A Core connection in a write transaction (see `write_session`)."""
        with self.engine.connect().execution_options(**{WRITE_LOCK: True}) as conn, conn.begin():
            yield conn

    async def run(self, fn: Callable[..., T], /, *args: object) -> T:
        """Run blocking store code in a worker thread, off the event loop.

        Except a `quick_read` on SQLite, which runs right here: a read in WAL mode never
        waits for the writer, and its few indexed lookups take tens of microseconds — less
        than handing the work to a thread and back. Under load that hand-off is far dearer
        than it looks: the worker needs the GIL back after every statement and waits for the
        busy event loop to give it up (up to the 5 ms switch interval), which made thread
        hops the largest part of an API read's latency. PostgreSQL reads cross the network,
        so they always go to a thread.
        """
        if self._inline_quick_reads and getattr(fn, QUICK_READ_ATTR, False):
            return fn(*args)
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        # URL.__repr__ hides the password.
        return f"Store({self.engine.url!r})"
