"""Run wake-ups between replicas: two stores (two replicas' engines) on one real PostgreSQL
database, each with its own `EventBus` and `Listener`. A step stored, an approval answered
and a cancel asked for through one wake the other's waiters and subscribers; a `LISTEN`
connection that breaks connects again and wakes everyone, so the notifications it missed
only delay. On SQLite nothing is sent: the writer's own process is the only reader."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from aamp.runs.bus import APPLICATION_NAME, APPROVAL, CANCEL, STEP, EventBus, Listener
from aamp.runs.store import RunStore
from aamp.store import Store

WAKE_SECONDS = 10.0  # nothing polls in these tests: without the wake-up, never


def _run(runs: RunStore) -> str:
    with runs.store.write_session() as s:
        s.execute(
            text(
                "INSERT INTO agents (id, name, owner, created_at) VALUES ('ag1', 'a', 'u', 't')"
                " ON CONFLICT DO NOTHING"
            )
        )
    return runs.create("ag1", 1, "alice", "t").id


@pytest.fixture
async def two_replicas(postgres_server) -> AsyncIterator[tuple[RunStore, RunStore, EventBus]]:  # type: ignore[no-untyped-def]
    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")
    writer, reader = Store.from_url(url), Store.from_url(url)
    bus = EventBus()
    listener = Listener(reader, bus)
    listener.start()
    try:
        await asyncio.wait_for(listener.listening.wait(), WAKE_SECONDS)
        yield RunStore(writer), RunStore(reader), bus
    finally:
        await listener.stop()
        writer.close()
        reader.close()


async def _woken(event: asyncio.Event) -> bool:
    return await EventBus.wait(event, WAKE_SECONDS)


async def test_a_step_stored_on_one_replica_wakes_a_reader_on_the_other(two_replicas) -> None:
    writer, reader, bus = two_replicas
    run_id = await asyncio.to_thread(_run, writer)
    waiter = bus.waiter(run_id)
    unrelated = bus.waiter("run-someone-else")
    await asyncio.to_thread(writer.append_event, run_id, 1, "run.queued", {})
    assert await _woken(waiter)
    assert [e.seq for e in reader.events_after(run_id, 0)] == [1]
    assert not unrelated.is_set()


async def test_an_approval_answered_and_a_cancel_asked_wake_the_other_replica(
    two_replicas,
) -> None:
    writer, _, bus = two_replicas
    run_id = await asyncio.to_thread(_run, writer)
    asked = await asyncio.to_thread(writer.request_approval, run_id, "data.outbound", {"n": 1})
    answered = bus.waiter(asked["id"], APPROVAL)
    await asyncio.to_thread(writer.decide, asked["id"], "approved", "user:bob")
    assert await _woken(answered)

    cancels: asyncio.Queue[str | None] = asyncio.Queue()
    bus.subscribe(CANCEL, cancels.put_nowait)
    await asyncio.to_thread(writer.request_cancel, run_id, "user:bob")
    assert await asyncio.wait_for(cancels.get(), WAKE_SECONDS) == run_id
    assert writer.cancel_requests({run_id}) == {run_id: "user:bob"}


async def test_a_broken_listen_connection_reconnects_and_wakes_everyone(two_replicas) -> None:
    writer, reader, bus = two_replicas
    run_id = await asyncio.to_thread(_run, writer)
    cancels: asyncio.Queue[str | None] = asyncio.Queue()
    bus.subscribe(CANCEL, cancels.put_nowait)
    waiter = bus.waiter(run_id, STEP)

    def cut() -> None:  # what a restart of the server or a network cut does to it
        with reader.store.engine.connect() as conn:
            killed = conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = :name"
                ),
                {"name": APPLICATION_NAME},
            ).all()
            assert len(killed) == 1

    await asyncio.to_thread(cut)
    # Nothing was sent: the listener's reconnection wakes every waiter and subscriber.
    assert await _woken(waiter)
    assert await asyncio.wait_for(cancels.get(), WAKE_SECONDS) is None
    # And it listens again: a step stored now wakes a new waiter.
    again = bus.waiter(run_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAKE_SECONDS
    seq = 0
    while not again.is_set():
        assert loop.time() < deadline, "the listener did not listen again"
        seq += 1
        await asyncio.to_thread(writer.append_event, run_id, seq, "tick", {})
        await EventBus.wait(again, 0.5)


def test_sqlite_sends_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store.from_url(f"sqlite:///{tmp_path}/aamp.db")
    try:
        runs = RunStore(store)
        run_id = _run(runs)
        runs.append_event(run_id, 1, "run.queued", {})  # no pg_notify on SQLite: no error
        assert runs.request_cancel(run_id, "user:bob").status == "queued"
    finally:
        store.close()
