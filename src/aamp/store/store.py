"""`Store`: the engine of one installation, migrated, plus the few ways code reaches it.

The engine is synchronous SQLAlchemy on purpose: the audit writer runs its batches in a
dedicated thread, and async callers use `await store.run(fn, ...)`, which runs `fn(session)`
in a worker thread. That keeps one driver per backend (pysqlite, psycopg 3) and no greenlet
magic between the event loop and the database.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from aamp.config import Settings
from aamp.store import migrate
from aamp.store.engine import WRITE_LOCK, create_store_engine
from aamp.store.url import database_url, normalise_url

T = TypeVar("T")


class Store:
    """One database: engine, sessions, write transactions. Close it when done."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

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
    def write_connection(self) -> Iterator[Connection]:
        """A Core connection in a write transaction (see `write_session`)."""
        with self.engine.connect().execution_options(**{WRITE_LOCK: True}) as conn, conn.begin():
            yield conn

    async def run(self, fn: Callable[..., T], /, *args: object) -> T:
        """Run blocking store code in a worker thread, off the event loop."""
        return await asyncio.to_thread(fn, *args)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        # URL.__repr__ hides the password.
        return f"Store({self.engine.url!r})"
