"""Small shared helpers for the audit tests (not fixtures)."""

from __future__ import annotations

import asyncio

from aamp.audit import AuditLog, AuditRecord


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
