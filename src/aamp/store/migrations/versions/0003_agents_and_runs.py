"""Versioned agent definitions; runs with their steps, artifacts and approvals.

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

RUN_STATUSES = (
    "queued",
    "running",
    "waiting_approval",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
)


def _fk_run(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["run_id"], ["runs.id"], name=op.f(f"fk_{table}_run_id_runs"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "agent_versions",
        sa.Column("agent_id", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("definition", sa.Text(), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("created_by", sa.String(256), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
        sa.Column("published_at", sa.String(32), nullable=True),
        sa.Column("published_by", sa.String(256), nullable=True),
        sa.CheckConstraint(
            "status IN ('draft', 'published')", name=op.f("ck_agent_versions_status")
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_agent_versions_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("agent_id", "version", name=op.f("pk_agent_versions")),
    )
    statuses = ", ".join(f"'{s}'" for s in RUN_STATUSES)
    op.create_table(
        "runs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("agent_id", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("sandbox_id", sa.String(64), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("started_at", sa.String(32), nullable=True),
        sa.Column("ended_at", sa.String(32), nullable=True),
        sa.CheckConstraint(f"status IN ({statuses})", name=op.f("ck_runs_status")),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_runs_agent_id_agents"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index("ix_runs_agent_id", "runs", ["agent_id"])
    op.create_index("ix_runs_owner", "runs", ["owner"])
    op.create_table(
        "run_events",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("at", sa.String(32), nullable=False),
        _fk_run("run_events"),
        sa.PrimaryKeyConstraint("run_id", "seq", name=op.f("pk_run_events")),
    )
    op.create_table(
        "run_artifacts",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        _fk_run("run_artifacts"),
        sa.PrimaryKeyConstraint("run_id", "name", name=op.f("pk_run_artifacts")),
    )
    op.create_table(
        "run_approvals",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requested_at", sa.String(32), nullable=False),
        sa.Column("decided_at", sa.String(32), nullable=True),
        sa.Column("decided_by", sa.String(256), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'approved', 'denied', 'expired', 'cancelled')",
            name=op.f("ck_run_approvals_status"),
        ),
        _fk_run("run_approvals"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_approvals")),
    )
    op.create_index("ix_run_approvals_run_id", "run_approvals", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_run_approvals_run_id", table_name="run_approvals")
    op.drop_table("run_approvals")
    op.drop_table("run_artifacts")
    op.drop_table("run_events")
    op.drop_index("ix_runs_owner", table_name="runs")
    op.drop_index("ix_runs_agent_id", table_name="runs")
    op.drop_table("runs")
    op.drop_table("agent_versions")
