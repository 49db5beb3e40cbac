"""Knowledge bases are granted to agents: `agent_resources` takes the kind `knowledge-base`.

(Knowledge bases themselves are kept as files under `$AAMP_HOME/knowledge-bases/`,
`aamp.catalog.knowledge_bases`; only their grants are rows.)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

OLD_KINDS = "kind IN ('policy', 'service', 'image', 'model-endpoint')"
NEW_KINDS = "kind IN ('policy', 'service', 'image', 'model-endpoint', 'knowledge-base')"


def _set_kinds(check: str) -> None:
    # SQLite cannot alter a CHECK constraint: batch mode copies the table there; PostgreSQL
    # gets ALTER TABLE.
    with op.batch_alter_table("agent_resources") as batch:
        batch.drop_constraint(op.f("ck_agent_resources_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_agent_resources_kind"), sa.text(check))


def upgrade() -> None:
    _set_kinds(NEW_KINDS)


def downgrade() -> None:
    op.execute("DELETE FROM agent_resources WHERE kind = 'knowledge-base'")
    _set_kinds(OLD_KINDS)
