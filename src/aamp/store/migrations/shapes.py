"""The column, constraint and index shapes that the revisions under `versions/` repeat.

A revision is the record of a schema step that installations have already applied, so what a
helper here builds is part of every revision that calls it: never change one (a fresh
database would then get another schema than an upgraded one); add a new helper instead.
Constraint names are spelled as the metadata's naming convention spells them
(`aamp.store.tables.base`) and passed through `op.f`, which marks them final; index names are
`ix_<table>_<columns>`. The helpers live beside `versions/` because Alembic loads every module
in that folder as a revision.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


def at(name: str, *, nullable: bool = False) -> sa.Column:
    """A moment: ISO-8601 UTC text, as `aamp.store.timestamps` writes it."""
    return sa.Column(name, sa.String(32), nullable=nullable)


def by(name: str, *, nullable: bool = False) -> sa.Column:
    """Who did something, named as the audit log names an actor."""
    return sa.Column(name, sa.String(256), nullable=nullable)


def created() -> list[sa.Column]:
    """`created_at`, `created_by`: when a row was made and by whom."""
    return [at("created_at"), by("created_by")]


def stamped() -> list[sa.Column]:
    """`created()` and `updated_at`, `updated_by`: a row that is also changed in place."""
    return [*created(), at("updated_at"), by("updated_by")]


def primary_key(table: str, *columns: str) -> sa.PrimaryKeyConstraint:
    return sa.PrimaryKeyConstraint(*columns, name=op.f(f"pk_{table}"))


def check(table: str, name: str, condition: str) -> sa.CheckConstraint:
    return sa.CheckConstraint(condition, name=op.f(f"ck_{table}_{name}"))


def cascade_to(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    """`table.column` refers to `target.id`; deleting the target deletes the row."""
    return sa.ForeignKeyConstraint(
        [column],
        [f"{target}.id"],
        name=op.f(f"fk_{table}_{column}_{target}"),
        ondelete="CASCADE",
    )


def index_name(table: str, *columns: str) -> str:
    return "_".join(("ix", table, *columns))


def create_index(table: str, *columns: str) -> None:
    op.create_index(index_name(table, *columns), table, list(columns))


def drop_index(table: str, *columns: str) -> None:
    op.drop_index(index_name(table, *columns), table_name=table)


def replace_check(table: str, name: str, condition: str) -> None:
    """Put `condition` in place of the table's check constraint `ck_<table>_<name>`."""
    # SQLite cannot alter a CHECK constraint: batch mode copies the table there; PostgreSQL
    # gets ALTER TABLE.
    with op.batch_alter_table(table) as batch:
        batch.drop_constraint(op.f(f"ck_{table}_{name}"), type_="check")
        batch.create_check_constraint(op.f(f"ck_{table}_{name}"), sa.text(condition))
