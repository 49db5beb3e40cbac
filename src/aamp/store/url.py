"""Which database an installation uses, decided from its settings alone.

SQLite under `$AAMP_HOME/aamp.db` needs no configuration (`aamp up` just works); PostgreSQL is
chosen by `AAMP_DATABASE_URL` and always goes through psycopg 3, whatever driver the operator's
URL names, so the rest of the store only ever meets two dialects.
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from aamp.config import Settings

DATABASE_URL_ENV = "AAMP_DATABASE_URL"
SQLITE_FILENAME = "aamp.db"


class DatabaseConfigError(ValueError):
    """The database setting cannot be used; the message names it (never its password)."""


def database_url(settings: Settings) -> URL:
    """The SQLAlchemy URL for this installation (SQLite file by default)."""
    raw = (settings.env.get(DATABASE_URL_ENV) or "").strip()
    if not raw:
        return URL.create("sqlite+pysqlite", database=str(settings.home / SQLITE_FILENAME))
    return normalise_url(raw)


def normalise_url(raw: str) -> URL:
    """Accept `postgresql://`, `postgres://`, `postgresql+psycopg://` and `sqlite:///path`."""
    if raw.startswith("postgres://"):
        raw = "postgresql://" + raw[len("postgres://") :]
    try:
        url = make_url(raw)
    except ArgumentError:
        raise DatabaseConfigError(
            f"{DATABASE_URL_ENV} is not a database URL (expected postgresql://user@host/db)"
        ) from None
    backend = url.get_backend_name()
    if backend == "postgresql":
        return url.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise DatabaseConfigError(
                f"{DATABASE_URL_ENV} must name an SQLite file; an in-memory database would "
                "lose the audit log"
            )
        return url.set(drivername="sqlite+pysqlite")
    raise DatabaseConfigError(
        f"{DATABASE_URL_ENV} names the unsupported database {backend!r}; "
        "use postgresql://... or leave it unset for SQLite"
    )
