"""Bring the database schema to the newest revision, programmatically, at start-up.

Several control-plane processes may start at once against one PostgreSQL database, so the
upgrade runs inside one transaction that first takes a transaction-scoped advisory lock; on
SQLite the transaction starts with `BEGIN IMMEDIATE`, which is the same thing for a file.

Alembic (with Mako and Pygments behind it) is imported by the functions that use it: a
command that reads the store without migrating it (`aamp audit verify|export`) never pays
for it.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, text

from aamp.store.engine import WRITE_LOCK

TYPE_CHECKING = False
if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# An arbitrary constant naming "aamp schema migration" among PostgreSQL advisory locks.
MIGRATION_LOCK_KEY = 0x61616D70_0001


def alembic_config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the migrations directory has no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply every pending migration; a no-op when the schema is current."""
    from alembic import command

    cfg = alembic_config()
    with engine.connect().execution_options(**{WRITE_LOCK: True}) as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
