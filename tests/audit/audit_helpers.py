"""Small shared helpers for the audit tests (not fixtures)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import text

from aamp.audit import AuditLog, AuditRecord
from aamp.store import Store


async def append_many(
    log: AuditLog, n: int, *, tasks: int = 1, prefix: str = "r"
) -> list[AuditRecord]:
    out: list[AuditRecord] = []

    async def worker(k: int) -> None:
        for i in range(k, n, tasks):
            out.append(
                await log.append(
                    actor=f"user:u{i % 7}",
                    action="sandbox.exec",
                    resource=f"sandbox:sb-{i:012x}",
                    decision="allow" if i % 3 else "deny",
                    reason="grant run on agent a" if i % 2 else None,
                    request_id=f"{prefix}-{i}",
                    details={"argv": ["python", "-c", f"print({i})"], "exit": i % 5, "é": "ü"},
                )
            )

    await asyncio.gather(*(worker(k) for k in range(tasks)))
    return out


async def wait_until(condition: Callable[[], bool], what: str, *, timeout: float = 15.0) -> float:
    """Poll `condition` until it holds (returns the seconds it took); fail after `timeout`."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not condition():
        if loop.time() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.02)
    return loop.time() - started


def truncate_tail(store: Store, keep: int) -> None:
    """What someone with database write access does to hide the newest records: delete them
    and their checkpoints, and move the head back to the record that stays last."""
    with store.write_connection() as conn:
        conn.execute(text("DELETE FROM audit_records WHERE seq > :k"), {"k": keep})
        conn.execute(text("DELETE FROM audit_checkpoints WHERE seq > :k"), {"k": keep})
        last = conn.execute(text("SELECT hash FROM audit_records WHERE seq = :k"), {"k": keep})
        conn.execute(
            text("UPDATE audit_head SET seq = :k, hash = :h WHERE id = 1"),
            {"k": keep, "h": last.scalar_one()},
        )


def witness_seqs(path: Path) -> list[int]:
    """The seqs of the witness file's lines (empty if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line)["seq"] for line in path.read_text().splitlines()]


def checkpoint_seqs(store: Store) -> list[int]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT seq FROM audit_checkpoints ORDER BY seq")).all()
    return [int(r[0]) for r in rows]


def head_seq(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT seq FROM audit_head WHERE id = 1")).scalar_one())
