"""Rows to values: a frozen value built from a table row, each field from the row's column of
the same name except those the caller converts (a column kept as JSON text, a 0/1 flag); the
row a request names, or `NotFound` saying what is missing; a new row, or `Conflict` saying
what it would take that is taken; and the row a write replaces by name, locked for the
transaction, or a new one; and one column of some rows, by key.

Usage::

    value_of(RunInfo, row)
    value_of(Service, row, auth=row.auth_kind, secrets=tuple(json.loads(row.secret_names)))
    row = existing(s, PolicyRow, name, f"no policy named {name!r}")
    row = added(s, AgentRow(name=name, ...), f"an agent named {name!r} already exists")
    row = locked_or_new(s, PolicyRow.name, name, lambda: PolicyRow(name=name, ...))
    values_where(s, SandboxRow.id, SandboxRow.lost_reason, ids, SandboxRow.state == "lost")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session

from aamp.errors import Conflict, found

T = TypeVar("T")


def value_of(kind: type[T], row: object, **given: Any) -> T:
    """`kind` (a dataclass) from `row`: `given` values first, the rest by column name."""
    names = (f.name for f in dataclasses.fields(kind) if f.init)  # type: ignore[arg-type]
    return kind(**{n: given[n] if n in given else getattr(row, n) for n in names})


def existing(session: Session, table: type[T], key: object, missing: str) -> T:
    """The row of `table` whose primary key is `key`; `NotFound(missing)` if there is none."""
    return found(session.get(table, key), missing)


def added(session: Session, row: T, taken: str) -> T:
    """`row`, added and flushed; `Conflict(taken)` if a unique key it holds is already held
    (the transaction is then rolled back as the error leaves it)."""
    session.add(row)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(taken) from None
    return row


def locked(session: Session, key: InstrumentedAttribute[Any], value: object) -> Any:
    """The row whose column `key` is `value`, or None, locked until the transaction ends (FOR
    UPDATE), so two writers of one name take turns."""
    return session.scalars(select(key.class_).where(key == value).with_for_update()).first()


def locked_or_new(
    session: Session, key: InstrumentedAttribute[Any], value: object, new: Callable[[], T]
) -> T:
    """`locked`, or if there is no such row, `new()`, added to the session."""
    row = locked(session, key, value)
    if row is None:
        row = new()
        session.add(row)
    return row


def values_where(
    session: Session,
    key: InstrumentedAttribute[Any],
    value: InstrumentedAttribute[Any],
    among: set[Any],
    *where: Any,
) -> dict[Any, Any]:
    """Of the rows whose `key` is one of `among` and that meet `where`, `key` → `value`."""
    rows = session.execute(select(key, value).where(key.in_(among), *where)).all()
    return dict(rows)  # type: ignore[arg-type]
