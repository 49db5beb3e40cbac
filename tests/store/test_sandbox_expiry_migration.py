"""Migration 0017 on both backends: every sandbox row placed before it gets an expiry (its
create's time plus the longest ttl a create could have had), the column is required from then
on, and downgrading takes it away again."""

from __future__ import annotations

import pytest
from alembic import command
from db_fixtures import settings  # noqa: F401  (fixture)
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from aamp.config import Settings
from aamp.store import Store, migrate

CREATED = "2026-03-01T10:00:00.000001Z"


def test_rows_placed_before_get_a_bounded_expiry(settings: Settings) -> None:  # noqa: F811
    with Store.open(settings, upgrade=False) as store:
        migrate.upgrade(store.engine, "0016")
        with store.engine.begin() as conn:
            for sandbox_id in ("sb-000000000001", "sb-000000000002"):
                conn.execute(
                    text(
                        "INSERT INTO sandboxes (id, host_id, host_epoch, state, millicpus,"
                        " memory_mb, created_at) VALUES (:i, 'h1', 1, 'live', 1000, 512, :t)"
                    ),
                    {"i": sandbox_id, "t": CREATED},
                )
        migrate.upgrade(store.engine)
        with store.engine.connect() as conn:
            got = conn.execute(text("SELECT id, expires_at FROM sandboxes ORDER BY id")).all()
        assert [tuple(r) for r in got] == [
            ("sb-000000000001", "2026-03-02T10:00:00.000001Z"),
            ("sb-000000000002", "2026-03-02T10:00:00.000001Z"),
        ]
        with pytest.raises(IntegrityError), store.engine.begin() as conn:  # required now
            conn.execute(
                text(
                    "INSERT INTO sandboxes (id, host_id, host_epoch, state, millicpus,"
                    " memory_mb, created_at) VALUES ('sb-000000000003', 'h1', 1, 'live', 1,"
                    " 1, :t)"
                ),
                {"t": CREATED},
            )
        with store.engine.connect() as conn, conn.begin():
            cfg = migrate.alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0016")
        columns = {c["name"] for c in inspect(store.engine).get_columns("sandboxes")}
        assert "expires_at" not in columns and "services" in columns
