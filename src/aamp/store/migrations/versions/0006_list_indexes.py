"""Indexes that serve the list pages in their own order, over any number of rows.

The run history is newest first (`created_at DESC, id DESC`), filtered by owner (an
operator's own runs), agent and status; the audit log is read by record number (`seq`),
filtered by actor (and outcome: someone's denials), action or resource. An index on the
filter column alone left the store to read every matching row and sort them before the
first page (hundreds of milliseconds at 100,000 runs or 1,000,000 records); with the sort
key appended to each index a page is an index range read in order, stopping after `limit`
rows. The single-column indexes these replace are their prefixes, so every lookup they
served is served still.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"

RUN_ORDER = ["created_at", "id"]
RUN_INDEXES = {
    "ix_runs_created": RUN_ORDER,
    "ix_runs_owner_created": ["owner", *RUN_ORDER],
    "ix_runs_agent_created": ["agent_id", *RUN_ORDER],
    "ix_runs_status_created": ["status", *RUN_ORDER],
    "ix_runs_agent_status_created": ["agent_id", "status", *RUN_ORDER],
}
AUDIT_INDEXES = {
    "ix_audit_records_actor_seq": ["actor", "seq"],
    "ix_audit_records_actor_decision_seq": ["actor", "decision", "seq"],
    "ix_audit_records_action_seq": ["action", "seq"],
    "ix_audit_records_resource_seq": ["resource", "seq"],
}
REPLACED = {
    "runs": {"ix_runs_agent_id": ["agent_id"], "ix_runs_owner": ["owner"]},
    "audit_records": {
        "ix_audit_records_actor": ["actor"],
        "ix_audit_records_resource": ["resource"],
    },
}


def upgrade() -> None:
    for name, columns in RUN_INDEXES.items():
        op.create_index(name, "runs", columns)
    for name, columns in AUDIT_INDEXES.items():
        op.create_index(name, "audit_records", columns)
    for table, indexes in REPLACED.items():
        for name in indexes:
            op.drop_index(name, table_name=table)


def downgrade() -> None:
    for table, indexes in REPLACED.items():
        for name, columns in indexes.items():
            op.create_index(name, table, columns)
    for name in AUDIT_INDEXES:
        op.drop_index(name, table_name="audit_records")
    for name in RUN_INDEXES:
        op.drop_index(name, table_name="runs")
