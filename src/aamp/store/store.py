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
import re
import sqlite3
import weakref
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from aamp.config import Settings
from aamp.store import migrate
from aamp.store.engine import PG_OPTIONS, POOL_SIZE, WRITE_LOCK, create_store_engine, open_sqlite
from aamp.store.url import database_url, normalise_url

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

QUICK_READ_ATTR = "__aamp_quick_read__"
READ_PLAN_ATTR = "__aamp_read_plan__"
# PostgreSQL connections each event loop keeps for read plans (`ReadPlanPool`), besides the
# engine's pool; a plan holds one only for its few round trips.
LOOP_READ_CONNECTIONS = 12
# A `:name` parameter (not a PostgreSQL `::type` cast).
_PARAM = re.compile(r"(?<!:):([a-z_]+)")

Rows = list[tuple[Any, ...]]
# A read plan: a generator that yields (SQL with `:name` parameters, parameters) and is sent
# back each statement's rows; what it returns is the result. Written once, it runs on a
# blocking connection (`Store.run_plan`) or, on PostgreSQL, on the event loop (`Store.run`).
ReadPlan = Generator[tuple[str, dict[str, Any]], Rows, T]
# Threads for `Store.run`: database work is mostly waiting (for the server, for a lock, for the
# GIL), so more threads than cores; asyncio's default pool (cores + 4 = 6 here) queued an API
# request behind others for tens of ms. The PostgreSQL pool is sized to match (engine.py).
STORE_THREADS = POOL_SIZE


def quick_read(fn: F) -> F:
    """Mark a store function as a few indexed reads and nothing else (no writes, no locks, no
    slow hashing), which `Store.run` may then run without a thread hop (see there)."""
    setattr(fn, QUICK_READ_ATTR, True)
    return fn


def read_plan(fn: Callable[..., ReadPlan[T]]) -> Callable[..., T]:
    """Turn a method `fn(self, *args)` that is a read plan (see `ReadPlan`) into a quick read
    `method(self, *args) -> result` of an object with a `store` attribute.

    Called directly, or through `Store.run` on SQLite, it runs the plan on
    `Store.read_connection`. Through `Store.run` on PostgreSQL it runs on the event loop on an
    asyncio psycopg connection: no worker thread, so no GIL hand-back after each statement,
    which cost a PostgreSQL API read tens of ms under load (see `Store.run`). The plan is the
    same code either way, so both paths read exactly the same rows.
    """

    @functools.wraps(fn)
    def method(owner: Any, *args: Any) -> T:
        return owner.store.run_plan(fn(owner, *args))  # type: ignore[no-any-return]

    setattr(method, READ_PLAN_ATTR, fn)
    return quick_read(method)


@functools.lru_cache(maxsize=64)
def render(sql: str, driver: str) -> str:
    """`sql` with its `:name` parameters as the driver takes named parameters."""
    if driver == "pysqlite":
        return sql
    if driver == "psycopg":
        return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))
    raise ValueError(f"unsupported database driver {driver!r}")


def query(conn: Connection, sql: str, params: dict[str, Any]) -> Rows:
    """Rows of `sql` (written with `:name` parameters), run on the driver's own cursor inside
    `conn`'s transaction (`Store.read_connection`): no SQLAlchemy statement machinery, which
    cost more CPU than the query itself."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(render(sql, conn.dialect.driver), params)
        return [tuple(r) for r in cursor.fetchall()]
    finally:
        cursor.close()


def _finish(plan: ReadPlan[T], rows_of: Callable[[str, dict[str, Any]], Rows]) -> T:
    """Drive `plan` to its result, answering each statement with `rows_of`."""
    try:
        step = next(plan)
        while True:
            step = plan.send(rows_of(*step))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class ReadPlanPool:
    """A few autocommit psycopg `AsyncConnection`s of one event loop, for read plans.

    Autocommit like `Store.read_connection` on PostgreSQL: each statement is one round trip
    and sees its own READ COMMITTED snapshot, exactly as on the blocking path. Each connection
    keeps ONE cursor for its life, reused by every plan it runs: a cursor of its own per plan
    (made, its adapters copied, closed) cost a read a tenth of its CPU; a cursor keeps no rows
    across statements (`execute` drops the previous result), so nothing is cached but the
    connections: every plan reads the database afresh.
    """

    def __init__(self, connect_kwargs: dict[str, Any], size: int) -> None:
        self._connect_kwargs = connect_kwargs
        self._slots = asyncio.Semaphore(size)
        self._idle: list[tuple[Any, Any]] = []  # (connection, its cursor)
        self._all: weakref.WeakSet[Any] = weakref.WeakSet()

    async def run(self, make_plan: Callable[[], ReadPlan[T]]) -> T:
        import psycopg

        async with self._slots:
            reused = bool(self._idle)
            conn, cursor = self._idle.pop() if reused else await self._connect()
            try:
                return await self._run(cursor, make_plan())
            except psycopg.OperationalError:
                if not (reused and conn.broken):
                    raise
                # An idle connection the server dropped (a restart, an idle timeout): a read
                # is safe to repeat, once, on a new connection.
                conn.pgconn.finish()
                conn, cursor = await self._connect()
                return await self._run(cursor, make_plan())
            finally:
                self._release(conn, cursor)

    def _release(self, conn: Any, cursor: Any) -> None:
        """Keep an idle connection (with its cursor) for the next plan; close one left
        mid-statement (a cancelled read) or broken."""
        if conn.closed or conn.broken or conn.info.transaction_status != 0:  # 0: idle
            conn.pgconn.finish()
        else:
            self._idle.append((conn, cursor))

    async def _connect(self) -> tuple[Any, Any]:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(**self._connect_kwargs)
        self._all.add(conn)
        return conn, conn.cursor()

    @staticmethod
    async def _run(cursor: Any, plan: ReadPlan[T]) -> T:
        try:
            step = next(plan)
            while True:
                sql, params = step
                await cursor.execute(render(sql, "psycopg"), params)
                step = plan.send(await cursor.fetchall())  # a list of tuples (tuple_row)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close every connection (synchronously: the loop may be gone by now)."""
        self._idle.clear()
        for conn in list(self._all):
            conn.pgconn.finish()


class LoopReader:
    """One SQLite connection of an event loop's thread, for the read plans `Store.run` runs
    inline there: each plan is one deferred read transaction (one snapshot; WAL readers never
    wait for the writer), exactly like `Store.read_connection`'s, without the engine's
    connection checkout, event hooks and check-in per plan, which cost five times the reads
    of an API request's authentication. Nothing is cached but the connection itself."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def run(self, plan: ReadPlan[T]) -> T:
        conn = self._conn
        conn.execute("BEGIN")
        try:
            return _finish(plan, self._rows)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _rows(self, sql: str, params: dict[str, Any]) -> Rows:
        cursor = self._conn.execute(sql, params)
        try:
            return [tuple(r) for r in cursor.fetchall()]
        finally:
            cursor.close()

    def close(self) -> None:
        self._conn.close()


class Store:
    """One database: engine, sessions, write transactions. Close it when done."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._inline_quick_reads = engine.dialect.name == "sqlite"
        self._executor = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="aamp-store")
        self._loop_reads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadPlanPool]
        self._loop_reads = weakref.WeakKeyDictionary()
        self._all_loop_reads: list[ReadPlanPool] = []
        self._loop_readers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopReader]
        self._loop_readers = weakref.WeakKeyDictionary()
        self._all_loop_readers: list[LoopReader] = []

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

    @contextmanager
    def one_write(self) -> Iterator[Connection]:
        """A Core connection for one write statement that is its own transaction: autocommit
        on PostgreSQL (one round trip, where BEGIN, the statement and COMMIT are three; the
        rows it locks stay locked until it ends), `write_connection` on SQLite."""
        if self.dialect != "postgresql":
            with self.write_connection() as conn:
                yield conn
            return
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            yield conn

    def run_plan(self, plan: ReadPlan[T], conn: Connection | None = None) -> T:
        """Run a read plan (see `ReadPlan`), blocking, on `conn` (in its transaction) or else
        on one `read_connection`."""
        if conn is not None:
            return _finish(plan, lambda sql, params: query(conn, sql, params))
        with self.read_connection() as own:
            return _finish(plan, lambda sql, params: query(own, sql, params))

    def _plan_pool(self) -> ReadPlanPool:
        loop = asyncio.get_running_loop()
        pool = self._loop_reads.get(loop)
        if pool is None:
            _, kwargs = self.engine.dialect.create_connect_args(self.engine.url)
            kwargs = {**kwargs, "autocommit": True, "options": PG_OPTIONS}
            pool = self._loop_reads[loop] = ReadPlanPool(kwargs, LOOP_READ_CONNECTIONS)
            self._all_loop_reads.append(pool)
        return pool

    async def run(self, fn: Callable[..., T], /, *args: object) -> T:
        """Run blocking store code in a worker thread, off the event loop.

        Except a `quick_read` on SQLite, which runs right here: a read in WAL mode never
        waits for the writer, and its few indexed lookups take tens of microseconds — less
        than handing the work to a thread and back. Under load that hand-off is far dearer
        than it looks: the worker needs the GIL back after every statement and waits for the
        busy event loop to give it up (up to the 5 ms switch interval), which made thread
        hops the largest part of an API read's latency. PostgreSQL reads cross the network,
        so they must not block the loop: a `read_plan` method runs on the loop's own asyncio
        connections (`ReadPlanPool`, awaiting each round trip), everything else in a thread.
        """
        plan = getattr(fn, READ_PLAN_ATTR, None)
        owner = getattr(fn, "__self__", None)
        if self._inline_quick_reads and getattr(fn, QUICK_READ_ATTR, False):
            if plan is not None and getattr(owner, "store", None) is self:
                return self._loop_reader().run(plan(owner, *args))  # type: ignore[no-any-return]
            return fn(*args)
        if plan is not None and owner is not None and self.dialect == "postgresql":
            return await self._plan_pool().run(lambda: plan(owner, *args))  # type: ignore[no-any-return]
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _loop_reader(self) -> LoopReader:
        loop = asyncio.get_running_loop()
        reader = self._loop_readers.get(loop)
        if reader is None:
            reader = self._loop_readers[loop] = LoopReader(open_sqlite(self.engine.url))
            self._all_loop_readers.append(reader)
        return reader

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        for pool in self._all_loop_reads:
            pool.close()
        self._all_loop_reads.clear()
        for reader in self._all_loop_readers:
            reader.close()
        self._all_loop_readers.clear()
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        # URL.__repr__ hides the password.
        return f"Store({self.engine.url!r})"
