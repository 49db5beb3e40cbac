"""Wakes whoever waits on a run's rows when they change: a step stored, a cancel asked for, an
approval answered, a lease given up for another replica to take.

The rows in the store are the truth; a wake-up only says "look again". A waiter takes its
waiter *before* reading the rows (so a change between its read and its wait still wakes it)
and reads them again at a bound anyway, so a wake-up that never comes only delays it.

In one process the writer wakes the waiters itself (`notify`): all that single-host SQLite
needs. On PostgreSQL the writer's transaction also sends `NOTIFY <channel>, '<key>'`
(`announce`; delivered at commit, so never before the row can be read), and every replica's
`Listener` — one `LISTEN` connection — turns what the other replicas sent into the same
`notify`. When that connection breaks, notifications sent meanwhile are lost: the listener
connects again and then wakes every waiter and subscriber (`notify_all`), so they all look.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from aamp.store import Store

log = logging.getLogger("aamp.runs")

STEP = "aamp_run"  # a step of run <key> was stored
CANCEL = "aamp_run_cancel"  # someone asked to cancel run <key>
APPROVAL = "aamp_approval"  # approval <key> was answered
LEASE = "aamp_run_lease"  # run <key>'s lease was given up for another replica to take
CHANNELS = (STEP, CANCEL, APPROVAL, LEASE)

# How long the listener waits for a notification before it checks its connection.
LISTEN_CHECK_SECONDS = 30.0
RECONNECT_SECONDS = 1.0
# How the listener's connection shows in `pg_stat_activity`.
APPLICATION_NAME = "aamp run wake-ups"

Subscriber = Callable[[str | None], None]  # a key, or None: "anything may have changed"


def announce(conn: Connection | Session, channel: str, key: str) -> None:
    """Tell the other replicas, when this transaction commits, that `key` changed on
    `channel` (PostgreSQL `NOTIFY`; nothing on SQLite, where one process uses the store)."""
    dialect = conn.get_bind().dialect if isinstance(conn, Session) else conn.dialect
    if dialect.name == "postgresql":
        conn.execute(text("SELECT pg_notify(:channel, :key)"), {"channel": channel, "key": key})


class EventBus:
    def __init__(self) -> None:
        self._waiters: dict[tuple[str, str], asyncio.Event] = {}
        self._subscribers: dict[str, list[Subscriber]] = {}

    def waiter(self, key: str, channel: str = STEP) -> asyncio.Event:
        return self._waiters.setdefault((channel, key), asyncio.Event())

    def subscribe(self, channel: str, subscriber: Subscriber) -> None:
        """Call `subscriber(key)` at every wake-up on `channel` (on the event loop)."""
        self._subscribers.setdefault(channel, []).append(subscriber)

    def notify(self, key: str, channel: str = STEP) -> None:
        event = self._waiters.pop((channel, key), None)
        if event is not None:
            event.set()
        self._call(channel, key)

    def notify_all(self) -> None:
        """Wake everyone: wake-ups may have been lost."""
        waiters, self._waiters = self._waiters, {}
        for event in waiters.values():
            event.set()
        for channel in list(self._subscribers):
            self._call(channel, None)

    def _call(self, channel: str, key: str | None) -> None:
        for subscriber in self._subscribers.get(channel, ()):
            try:
                subscriber(key)
            except Exception:  # one subscriber's bug must not stop the others' wake-ups
                log.exception("a subscriber of %s failed", channel)

    @staticmethod
    async def wait(event: asyncio.Event, timeout: float) -> bool:
        """True if woken, False after `timeout` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
            return True
        return False


class Listener:
    """This replica's `LISTEN` connection (PostgreSQL only), feeding `bus`."""

    def __init__(self, store: Store, bus: EventBus) -> None:
        self.store = store
        self.bus = bus
        self.listening = asyncio.Event()  # set while the connection listens
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="run-listener")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its cancellation, awaited

    async def _run(self) -> None:
        import psycopg

        _, kwargs = self.store.engine.dialect.create_connect_args(self.store.engine.url)
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    **kwargs, autocommit=True, application_name=APPLICATION_NAME
                )
                try:
                    await self._listen(conn)
                finally:
                    self.listening.clear()
                    await conn.close()
            except (psycopg.Error, OSError) as exc:
                log.warning("run wake-ups: the LISTEN connection failed (%s); reconnecting", exc)
            self.bus.notify_all()  # whatever was sent while it was down is lost
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _listen(self, conn: Any) -> None:
        for channel in CHANNELS:
            await conn.execute(f"LISTEN {channel}")
        self.listening.set()
        # Anything sent before LISTEN took effect was missed: look again.
        self.bus.notify_all()
        while True:
            async for note in conn.notifies(timeout=LISTEN_CHECK_SECONDS):
                self.bus.notify(note.payload, note.channel)
            await conn.execute("SELECT 1")  # a dead connection raises here
