"""Run leases on a real store (SQLite file and a real PostgreSQL server): a replica's run is
taken over by another only once its lease expired, by exactly one replica even when several
ask at once (`FOR UPDATE SKIP LOCKED`), and the replica that stalled learns it lost it.
Each replica has its own `Store` (its own engine and connections), as separate processes do."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import db_fixtures
import pytest
from sqlalchemy import text

from aamp.runs.leases import LeaseLost, RunLeases
from aamp.runs.store import RunStore
from aamp.store import Store

settings = db_fixtures.settings
store = db_fixtures.store


def _runs(store: Store, n: int) -> list[str]:
    with store.write_connection() as conn:
        conn.execute(
            text("INSERT INTO agents (id, name, owner, created_at) VALUES ('ag1', 'a', 'u', 't')")
        )
    return [RunStore(store).create("ag1", 1, "u", f"task {i}").id for i in range(n)]


def test_an_expired_lease_is_taken_over_and_its_old_owner_learns_it(
    store: Store, database_url: str
) -> None:
    now = [1_000_000.0]
    (run,) = _runs(store, 1)
    other_store = Store.from_url(database_url)
    try:
        a = RunLeases(store, "replica-a", seconds=10, clock=lambda: now[0])
        b = RunLeases(other_store, "replica-b", seconds=10, clock=lambda: now[0])
        a.take(run)
        assert b.claim_expired() is None  # held, not expired
        now[0] += 9
        assert a.renew({run}) == set()  # still a's: renewed to now + 10
        now[0] += 9
        assert b.claim_expired() is None
        now[0] += 2  # a stalled: no renewal for 11 s
        assert b.claim_expired() == (run, "replica-a")
        assert b.claim_expired() is None  # b holds it now
        assert a.renew({run}) == {run}  # a must stop driving it
        assert b.renew({run}) == set()
        # A finished run is nobody's, and never claimed again.
        RunStore(other_store).update(run, status="running")
        RunStore(other_store).update(run, status="succeeded")
        b.release(run)
        now[0] += 100
        assert a.claim_expired() is None and b.claim_expired() is None
    finally:
        other_store.close()


def test_a_run_without_a_lease_counts_as_expired_once_older_than_a_lease(store: Store) -> None:
    (run,) = _runs(store, 1)  # e.g. made before leases existed, or its process died first
    now = [time.time()]
    leases = RunLeases(store, "replica-a", seconds=10, clock=lambda: now[0])
    assert leases.claim_expired() is None  # just made: its starter is about to take it
    now[0] += 11
    assert leases.claim_expired() == (run, None)


def test_concurrent_claims_hand_each_run_to_exactly_one_replica(
    store: Store, database_url: str
) -> None:
    runs = _runs(store, 12)
    stores = [Store.from_url(database_url) for _ in range(3)]
    try:
        later = time.time() + 60  # every run is older than a lease: all claimable
        replicas = [
            RunLeases(s, f"replica-{i}", seconds=10, clock=lambda: later)
            for i, s in enumerate(stores)
        ]

        def drain(leases: RunLeases) -> list[str]:
            got = []
            while (claimed := leases.claim_expired()) is not None:
                got.append(claimed[0])
            return got

        with ThreadPoolExecutor(3) as pool:
            claimed = list(pool.map(drain, replicas))
    finally:
        for s in stores:
            s.close()
    every = [r for got in claimed for r in got]
    assert sorted(every) == sorted(runs)  # each run once, none twice
    with store.engine.connect() as conn:
        owners = dict(conn.execute(text("SELECT id, lease_owner FROM runs")).all())
    for i, got in enumerate(claimed):
        assert all(owners[r] == f"replica-{i}" for r in got)


def test_a_fenced_out_replica_writes_nothing(store: Store, database_url: str) -> None:
    now = [time.time() + 60]
    (run,) = _runs(store, 1)
    other_store = Store.from_url(database_url)
    try:
        a = RunLeases(store, "replica-a", seconds=10, clock=lambda: now[0])
        b = RunLeases(other_store, "replica-b", seconds=10, clock=lambda: now[0])
        runs_a, runs_b = RunStore(store), RunStore(other_store)
        a.take(run)
        stale = a.fence(run)
        assert stale is not None and stale.epoch == 1
        runs_a.update(run, stale, status="running")
        runs_a.append_event(run, 1, "model.call", {"step": 1}, (1, 5, 7), stale)
        now[0] += 11  # a stalls past its lease; b takes the run over
        assert b.claim_expired() == (run, "replica-a")
        fresh = b.fence(run)
        assert fresh is not None and fresh.epoch == 2
        with pytest.raises(LeaseLost, match="driven by replica-b now"):
            runs_a.append_event(run, 2, "model.call", {"step": 2}, (1, 5, 7), stale)
        with pytest.raises(LeaseLost):
            runs_a.update(run, stale, status="failed", reason="a woke up")
        with pytest.raises(LeaseLost):
            runs_a.add_artifact(run, "x.txt", 1, "0" * 64, stale)
        with pytest.raises(LeaseLost):
            runs_a.request_approval(run, "egress", {"host": "h", "port": 1}, stale)
        # Nothing of a's changed the run: one step, its counters, still running, no artifact.
        info = runs_b.get(run)
        assert (info.status, info.steps, info.prompt_tokens) == ("running", 1, 5)
        assert [e.seq for e in runs_b.events_after(run, 0)] == [1]
        assert runs_b.artifacts(run) == [] and runs_b.approvals(pending_only=False) == []
        # b writes under its own lease; a learns at its renewal that it lost the run.
        runs_b.append_event(run, 2, "model.call", {"step": 2}, (1, 5, 7), fresh)
        assert a.renew({run}) == {run} and a.held() == set()
        # Lost, a's writes still name its stale lease, so they go on being refused.
        assert a.fence(run) == stale
        with pytest.raises(LeaseLost):
            runs_a.append_event(run, 3, "tool.result", {"step": 2}, None, a.fence(run))
        a.release(run)  # a release by the old holder leaves b's lease alone
        assert a.fence(run) is None
        assert b.renew({run}) == set()
        assert runs_b.get(run).steps == 2
    finally:
        other_store.close()


def test_at_start_up_on_one_process_every_unfinished_run_is_claimed_at_once(store: Store) -> None:
    first, second = _runs(store, 2)
    leases = RunLeases(store, "replica-a", seconds=10)
    leases.take(first)  # a run this very process started stays its own
    assert leases.claim_expired() is None  # neither expired yet
    assert leases.claim_expired(any_age=True) == (second, None)
    assert leases.claim_expired(any_age=True) is None


def test_a_run_that_ended_under_its_lease_is_not_lost_to_its_driver(store: Store) -> None:
    """The driver stores `run.finished` just after the ending's status: a renewal between the
    two must not stop it, nor have that last step refused."""
    (run,) = _runs(store, 1)
    a = RunLeases(store, "replica-a", seconds=10)
    a.take(run)
    fence = a.fence(run)
    RunStore(store).update(run, fence, status="running")
    RunStore(store).update(run, fence, status="succeeded")
    assert a.renew({run}) == set()
    assert a.fence(run) == fence and not a.fence(run).lost  # type: ignore[union-attr]
    RunStore(store).append_event(run, 1, "run.finished", {}, fence=a.fence(run))
