"""When each placed sandbox expires (`sandboxes.expires_at`: its create's time plus its ttl),
so a replica refuses its host every credential ask and every report for it past then, and
reaps it there if its host did not (`aamp.fleet.sandboxes`). Rows made before this revision
get their create's time plus the longest ttl any create could have had (24 h): an upper
bound, never a sandbox without an end.
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from alembic import op

from aamp.store.migrations.shapes import at, create_index, drop_index
from aamp.store.timestamps import format_time, parse_time

revision = "0017"
down_revision = "0016"
# The longest ttl a create could ask for when this revision was written (`MAX_TTL_SECONDS`).
LONGEST_TTL = timedelta(hours=24)


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(at("expires_at", nullable=True))
    rows = sa.table("sandboxes", sa.column("id"), sa.column("created_at"), sa.column("expires_at"))
    connection = op.get_bind()
    for sandbox_id, created_at in connection.execute(sa.select(rows.c.id, rows.c.created_at)):
        expires_at = format_time(parse_time(created_at) + LONGEST_TTL)
        connection.execute(
            rows.update().where(rows.c.id == sandbox_id).values(expires_at=expires_at)
        )
    with op.batch_alter_table("sandboxes") as batch:
        batch.alter_column("expires_at", existing_type=sa.String(32), nullable=False)
    create_index("sandboxes", "expires_at")


def downgrade() -> None:
    drop_index("sandboxes", "expires_at")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("expires_at")
