"""An index on agents.owner: every request's grants statement looks up the agents its user owns.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_agents_owner", "agents", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_agents_owner", table_name="agents")
