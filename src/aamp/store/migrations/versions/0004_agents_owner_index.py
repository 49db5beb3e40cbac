"""An index on agents.owner: every request's grants statement looks up the agents its user owns."""

from __future__ import annotations

from aamp.store.migrations.shapes import create_index, drop_index

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    create_index("agents", "owner")


def downgrade() -> None:
    drop_index("agents", "owner")
