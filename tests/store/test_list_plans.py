"""The list pages' queries read an index in their own order on both backends (EXPLAIN): the
run history (newest first, by owner, agent, status, and a page far back) and the audit log
(by record number, filtered by actor, action or resource) never sort the matching rows, so
a page costs `limit` rows however big the table (migration 0006)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event

from aamp.agents.registry import AgentRegistry
from aamp.api.audit import _query as audit_page
from aamp.runs.store import RunStore
from aamp.store import Store


def _statements(store: Store, call: Callable[[], Any], table: str) -> list[tuple[str, Any]]:
    """The SQL (and parameters) `call` sent that reads `table`."""
    seen: list[tuple[str, Any]] = []

    def before(_conn, _cursor, statement, parameters, _context, _many) -> None:  # type: ignore[no-untyped-def]
        seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", before)
    try:
        call()
    finally:
        event.remove(store.engine, "before_cursor_execute", before)
    return [(s, p) for s, p in seen if f"FROM {table}" in s and "LIMIT" in s.upper()]


def _plan(store: Store, statement: str, parameters: Any) -> str:
    with store.engine.connect() as conn:
        if store.dialect == "sqlite":
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
            return "\n".join(str(r[-1]) for r in rows)
        # Tables this small are cheapest read whole, or by bitmap, and sorted; whether an index
        # gives the rows in order is the question (a Sort still shows where none can).
        for switch in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
            conn.exec_driver_sql(f"SET {switch} = off")
        rows = conn.exec_driver_sql(f"EXPLAIN {statement}", parameters).all()
        return "\n".join(str(r[0]) for r in rows)


def _assert_in_index_order(store: Store, plan: str, index: str, ranged: bool = False) -> None:
    assert index in plan, plan
    if store.dialect == "sqlite":
        assert "TEMP B-TREE" not in plan, plan  # no sort of the matching rows
        if ranged:
            assert f"SEARCH runs USING INDEX {index} (" in plan and "<" in plan, plan
    else:
        assert "Sort" not in plan, plan
        if ranged:
            assert "Index Cond" in plan and "created_at" in plan, plan


@pytest.fixture
def some_runs(store: Store) -> tuple[RunStore, str, str]:
    agent = AgentRegistry(store).create("lister", owner="admin")
    runs = RunStore(store)
    made = [runs.create(agent.id, 1, f"u{i % 3}", f"task {i}") for i in range(6)]
    return runs, agent.id, made[3].id


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({}, "ix_runs_created"),
        ({"owner": "u1"}, "ix_runs_owner_created"),
        ({"agent": "AGENT"}, "ix_runs_agent_created"),
        ({"status": "failed"}, "ix_runs_status_created"),
        ({"agent": "AGENT", "status": "failed"}, "ix_runs_agent_status_created"),
    ],
)
def test_the_run_history_reads_an_index_newest_first(
    store: Store, some_runs: tuple[RunStore, str, str], filters: dict[str, str], index: str
) -> None:
    runs, agent, _ = some_runs
    asked = {k: (agent if v == "AGENT" else v) for k, v in filters.items()}
    [(statement, parameters)] = _statements(store, lambda: runs.list(**asked, limit=25), "runs")
    _assert_in_index_order(store, _plan(store, statement, parameters), index)


def test_a_page_far_back_is_a_range_of_the_index(
    store: Store, some_runs: tuple[RunStore, str, str]
) -> None:
    runs, _, middle = some_runs
    [(statement, parameters)] = _statements(
        store, lambda: runs.list(before=middle, limit=25), "runs"
    )
    _assert_in_index_order(store, _plan(store, statement, parameters), "ix_runs_created", True)


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"actor": "user:u7"}, "ix_audit_records_actor_seq"),
        ({"actor": "user:u7", "decision": "deny"}, "ix_audit_records_actor_decision_seq"),
        ({"action": "sandbox.exec"}, "ix_audit_records_action_seq"),
        ({"resource": "sandbox:sb-1", "decision": "deny"}, "ix_audit_records_resource_seq"),
    ],
)
def test_the_audit_log_filtered_reads_an_index_by_record_number(
    store: Store, filters: dict[str, str], index: str
) -> None:
    [(statement, parameters)] = _statements(
        store, lambda: audit_page(store, filters, 1000, 50), "audit_records"
    )
    _assert_in_index_order(store, _plan(store, statement, parameters), index)
