"""`GET /v1/audit`: read the audit log with filters (admins only), oldest first, by pages."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel
from sqlalchemy import select

from aamp.api.errors import ApiError
from aamp.api.guard import cp_of, guarded_router, rule
from aamp.audit import ShownRecord, verify_installation
from aamp.store import Store
from aamp.store.tables import AuditRecordRow
from aamp.store.timestamps import format_time

_r = AuditRecordRow.__table__.c


class AuditVerifyOut(BaseModel):
    ok: bool
    summary: str


class AuditPageOut(BaseModel):
    records: list[ShownRecord]
    next_after_seq: int | None


def _bound(text: str | None, name: str) -> str | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ApiError(400, "invalid_request", f"{name}: not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise ApiError(400, "invalid_request", f"{name}: give a time zone (e.g. Z)")
    return format_time(moment)


def _query(store: Store, filters: dict[str, Any], after: int, limit: int) -> list[dict[str, Any]]:
    import json

    stmt = select(AuditRecordRow.__table__).where(_r.seq > after)
    for column in ("actor", "action", "resource", "decision", "request_id"):
        if filters.get(column) is not None:
            stmt = stmt.where(_r[column] == filters[column])
    if filters.get("since") is not None:
        stmt = stmt.where(_r.time >= filters["since"])
    if filters.get("until") is not None:
        stmt = stmt.where(_r.time < filters["until"])
    with store.engine.connect() as conn:
        rows = conn.execute(stmt.order_by(_r.seq).limit(limit)).mappings().all()
    return [{**dict(row), "details": json.loads(row["details"])} for row in rows]


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["audit"])

    @r.get("/audit", response_model=AuditPageOut)
    @rule("audit.read")
    async def read_audit(
        request: Request,
        actor: Annotated[str | None, Query(max_length=256)] = None,
        action: Annotated[str | None, Query(max_length=128)] = None,
        resource: Annotated[str | None, Query(max_length=512)] = None,
        decision: Annotated[str | None, Query(max_length=32)] = None,
        request_id: Annotated[str | None, Query(max_length=128)] = None,
        since: Annotated[str | None, Query(max_length=64, description="ISO 8601")] = None,
        until: Annotated[str | None, Query(max_length=64, description="ISO 8601")] = None,
        after_seq: Annotated[int, Query(ge=0, le=2**62)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, object]:
        filters = {
            "actor": actor,
            "action": action,
            "resource": resource,
            "decision": decision,
            "request_id": request_id,
            "since": _bound(since, "since"),
            "until": _bound(until, "until"),
        }
        cp = cp_of(request)
        rows = await cp.store.run(_query, cp.store, filters, after_seq, limit)
        return {
            "records": rows,
            "next_after_seq": rows[-1]["seq"] if len(rows) == limit else None,
        }

    @r.get("/audit/verify", response_model=AuditVerifyOut)
    @rule("audit.read")
    async def verify_audit(request: Request) -> dict[str, object]:
        """Check the whole chain, its signed checkpoints and the witness now (as `aamp audit
        verify` does); the first problem is named. It reads every record: a button, not a
        page load."""
        cp = cp_of(request)
        report = await cp.store.run(verify_installation, cp.store, cp.settings.home)
        return {"ok": report.ok, "summary": report.summary()}

    return r
