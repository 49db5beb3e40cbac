"""Alembic environment: always handed a live connection by `aamp.store.migrate`.

There is no alembic.ini and no URL here: migrations run programmatically at start-up, inside
the transaction (and lock) that `migrate.upgrade` opened.
"""

from __future__ import annotations

from alembic import context

from aamp.store.tables import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    transactional_ddl=True,
)
with context.begin_transaction():
    context.run_migrations()
