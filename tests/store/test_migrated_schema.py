"""The schema the migrations build is the one the ORM tables describe, down to what Alembic's
own comparison does not look at: check constraints, server defaults and foreign-key actions.

Each backend gets two fresh databases, one taken to `upgrade head`, one built by
`metadata.create_all`, and their reflected schemas must be equal. A revision edited by mistake
(or a helper in `migrations/shapes.py` changed under the revisions that call it) shows here.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pgtemp import TemporaryPostgres
from sqlalchemy import Engine, create_engine, inspect

from aamp.store import migrate
from aamp.store.tables import metadata

# Server defaults that revision 0008 gives `hosts` and `HostRow` does not declare: the one
# known difference (the ORM always writes these columns). Fixing the ORM shrinks this list.
MIGRATION_ONLY_DEFAULTS = {
    "hosts": {"epoch": "0", "drivers": "[]", "images": "[]"}
    | dict.fromkeys(("millicpus", "memory_mb", "sandboxes"), "0")
    | dict.fromkeys(("used_millicpus", "used_memory_mb", "used_sandboxes"), "0")
}


def _without_known_defaults(got: dict[str, Any], want: dict[str, Any]) -> None:
    for table, defaults in MIGRATION_ONLY_DEFAULTS.items():
        for name, value in defaults.items():
            got_type, got_null, got_default, got_auto = got[table]["columns"][name]
            # SQLite reflects '0', PostgreSQL '0' or '[]'::text
            assert str(got_default).split("::")[0].strip("'") == value, (table, name, got_default)
            assert want[table]["columns"][name][2] is None, f"{table}.{name}: shrink the list"
            got[table]["columns"][name] = (got_type, got_null, None, got_auto)


def _engines(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> list[Engine]:
    if backend == "sqlite":
        return [create_engine(f"sqlite:///{tmp_path}/{name}.db") for name in ("a", "b")]
    pg: TemporaryPostgres = request.getfixturevalue("postgres_server")
    return [create_engine(pg.create_database(f"s_{uuid.uuid4().hex[:12]}")) for _ in range(2)]


def _schema(engine: Engine) -> dict[str, Any]:
    """Every table's columns, keys, indexes and constraints, in an order-free form."""
    inspector = inspect(engine)
    schema: dict[str, Any] = {}
    for table in sorted(set(inspector.get_table_names()) - {"alembic_version"}):
        columns = {
            c["name"]: (str(c["type"]), c["nullable"], c["default"], c.get("autoincrement"))
            for c in inspector.get_columns(table)
        }
        pk = inspector.get_pk_constraint(table)
        schema[table] = {
            "columns": columns,
            "primary key": (pk["name"], tuple(pk["constrained_columns"])),
            "foreign keys": sorted(
                (
                    fk["name"],
                    tuple(fk["constrained_columns"]),
                    fk["referred_table"],
                    tuple(fk["referred_columns"]),
                    sorted(fk["options"].items()),
                )
                for fk in inspector.get_foreign_keys(table)
            ),
            "indexes": sorted(
                (ix["name"], tuple(ix["column_names"]), bool(ix["unique"]))
                for ix in inspector.get_indexes(table)
            ),
            "unique": sorted(
                (uq["name"], tuple(uq["column_names"]))
                for uq in inspector.get_unique_constraints(table)
            ),
            "checks": sorted(
                (ck["name"], " ".join(ck["sqltext"].split()))
                for ck in inspector.get_check_constraints(table)
            ),
        }
    return schema


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_upgrade_head_builds_the_orm_schema(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    migrated, declared = _engines(backend, tmp_path, request)
    try:
        migrate.upgrade(migrated)
        metadata.create_all(declared)
        got, want = _schema(migrated), _schema(declared)
        _without_known_defaults(got, want)
        assert got.keys() == want.keys()
        for table in want:
            assert got[table] == want[table], table
    finally:
        migrated.dispose()
        declared.dispose()
