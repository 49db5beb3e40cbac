"""Knowledge bases are granted to agents: `agent_resources` takes the kind `knowledge-base`.

(Knowledge bases themselves are kept as files under `$AAMP_HOME/knowledge-bases/`,
`aamp.catalog.knowledge_bases`; only their grants are rows.)
"""

from __future__ import annotations

from alembic import op

from aamp.store.migrations.shapes import replace_check

revision = "0010"
down_revision = "0009"

OLD_KINDS = "kind IN ('policy', 'service', 'image', 'model-endpoint')"
NEW_KINDS = "kind IN ('policy', 'service', 'image', 'model-endpoint', 'knowledge-base')"


def upgrade() -> None:
    replace_check("agent_resources", "kind", NEW_KINDS)


def downgrade() -> None:
    op.execute("DELETE FROM agent_resources WHERE kind = 'knowledge-base'")
    replace_check("agent_resources", "kind", OLD_KINDS)
