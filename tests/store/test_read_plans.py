"""Read plans (`aamp.store.store.read_plan`) on both backends: `Store.run` runs them on the
event loop's own thread (SQLite inline, PostgreSQL on the loop's asyncio connections), they
read the database afresh every time (a revoked token or grant counts from the next call),
and on PostgreSQL a dropped or cancelled connection is never handed to the next read."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sqlalchemy import event, text

from aamp.agents.registry import AgentRegistry
from aamp.identity import Directory
from aamp.identity.errors import AuthenticationFailed
from aamp.identity.model import Level
from aamp.store import Store
from aamp.store.store import ReadPlan, read_plan


class ProbeForTests:
    """A store user with a few read plans of its own."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @read_plan
    def answer(self, value: int) -> ReadPlan[tuple[int, str]]:
        rows = yield "SELECT :value + 1", {"value": value}
        return int(rows[0][0]), threading.current_thread().name

    @read_plan
    def divide(self, by: int) -> ReadPlan[int]:
        rows = yield "SELECT 1 / :by", {"by": by}
        return int(rows[0][0])

    @read_plan
    def slow(self, seconds: float) -> ReadPlan[int]:
        rows = yield "SELECT 1 FROM pg_sleep(:seconds)", {"seconds": seconds}
        return len(rows)


def _backends(store: Store) -> int:
    """Connections to this store's PostgreSQL database, seen from a connection of its own."""
    with store.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


async def test_a_plan_runs_on_the_event_loop_thread_on_both_backends(store: Store) -> None:
    probe = ProbeForTests(store)
    value, thread = await store.run(probe.answer, 41)
    assert value == 42
    assert thread == threading.current_thread().name
    assert probe.answer(1)[0] == 2  # called directly: blocking, on a read connection


async def test_revoked_token_and_removed_grant_count_from_the_next_read(store: Store) -> None:
    directory = Directory(store)
    directory.create_user("owner", "builder", "owner-password-1", by="t")
    directory.create_user("op", "operator", "operator-password-1", by="t")
    agents = AgentRegistry(store)
    agent = agents.create("probe", owner="owner")
    grant = directory.grant_user(agent.id, "op", level="view", by="t")
    token, secret = directory.create_token("op", "laptop")

    actor, stale = await store.run(directory.token_actor, secret)
    assert stale and actor.username == "op" and actor.token_id == token.id
    assert actor.agents[agent.id].level is Level.VIEW
    assert (await store.run(agents.get, agent.id)).name == "probe"

    directory.revoke_grant(agent.id, grant.id)
    actor, _ = await store.run(directory.token_actor, secret)
    assert agent.id not in actor.agents

    directory.revoke_token(token.id)
    with pytest.raises(AuthenticationFailed, match="revoked"):
        await store.run(directory.token_actor, secret)
    with pytest.raises(AuthenticationFailed, match="not valid"):
        await store.run(directory.token_actor, "no-such-token")


async def test_a_dropped_idle_connection_is_replaced(store: Store) -> None:
    if store.dialect != "postgresql":
        pytest.skip("connections to a server are PostgreSQL's")
    probe = ProbeForTests(store)
    assert (await store.run(probe.answer, 1))[0] == 2
    with store.engine.connect() as conn:  # as a server restart would
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    store.engine.dispose()
    assert (await store.run(probe.answer, 2))[0] == 3


async def test_a_cancelled_read_does_not_leave_its_connection_busy(store: Store) -> None:
    if store.dialect != "postgresql":
        pytest.skip("pg_sleep is PostgreSQL's")
    probe = ProbeForTests(store)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(store.run(probe.slow, 5), timeout=0.2)
    answers = await asyncio.gather(*(store.run(probe.answer, n) for n in range(30)))
    assert [a for a, _ in answers] == [n + 1 for n in range(30)]


async def test_a_connection_keeps_one_cursor_for_every_plan_it_runs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    if store.dialect != "postgresql":
        pytest.skip("the loop's asyncio connections are PostgreSQL's")
    import psycopg

    made: list[object] = []
    real_cursor = psycopg.AsyncConnection.cursor

    def counted(conn: psycopg.AsyncConnection, *args: object, **kwargs: object) -> object:
        made.append(conn)
        return real_cursor(conn, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(psycopg.AsyncConnection, "cursor", counted)
    probe = ProbeForTests(store)
    for n in range(20):  # one after another: one connection serves them all
        assert (await store.run(probe.answer, n))[0] == n + 1
    assert len(made) == 1
    # A statement the server refuses leaves the connection and its cursor fit for the next.
    with pytest.raises(psycopg.errors.DivisionByZero):
        await store.run(probe.divide, 0)
    assert await store.run(probe.divide, 1) == 1
    assert (await store.run(probe.answer, 7))[0] == 8
    assert len(made) == 1


async def test_close_closes_the_loop_connections(store: Store) -> None:
    if store.dialect != "postgresql":
        pytest.skip("connections to a server are PostgreSQL's")
    probe = ProbeForTests(store)
    await asyncio.gather(*(store.run(probe.answer, n) for n in range(8)))
    store.engine.dispose()
    assert _backends(store) >= 1
    store.close()
    # A server backend leaves pg_stat_activity a moment after its client hung up.
    deadline = time.monotonic() + 10
    while _backends(store) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _backends(store) == 0


class SnapshotProbeForTests:
    """A plan that reads a row twice and has a writer commit a change between the reads."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _write(self, value: str) -> None:
        with self.store.write_connection() as conn:
            conn.execute(text("UPDATE probe_rows SET value = :v"), {"v": value})

    @read_plan
    def twice(self, change_to: str) -> ReadPlan[tuple[str, str, str]]:
        first = yield "SELECT value FROM probe_rows", {}
        self._write(change_to)
        second = yield "SELECT value FROM probe_rows", {}
        return first[0][0], second[0][0], threading.current_thread().name


async def test_an_inline_sqlite_plan_is_one_snapshot_on_the_loops_own_connection(
    store: Store,
) -> None:
    if store.dialect != "sqlite":
        pytest.skip("inline plans are SQLite's")
    with store.write_connection() as conn:
        conn.execute(text("CREATE TABLE probe_rows (value TEXT)"))
        conn.execute(text("INSERT INTO probe_rows VALUES ('a')"))
    checkouts: list[object] = []
    event.listen(store.engine, "checkout", lambda *args: checkouts.append(args))
    probe = SnapshotProbeForTests(store)
    first, second, thread = await store.run(probe.twice, "b")
    assert (first, second) == ("a", "a")  # both reads of one plan see one snapshot
    assert thread == threading.current_thread().name
    # Only the writer took an engine connection: the plan ran on the loop's own.
    assert len(checkouts) == 1
    first, second, _ = await store.run(probe.twice, "c")
    assert (first, second) == ("b", "b")  # the next plan reads afresh
    assert len(checkouts) == 2
    assert probe.twice("d")[:2] == ("c", "c")  # called directly: an engine read connection
