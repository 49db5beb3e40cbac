"""Versioned agent definitions; runs with their steps, artifacts and approvals."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from aamp.store.migrations.shapes import (
    at,
    by,
    cascade_to,
    check,
    create_index,
    created,
    drop_index,
    primary_key,
)

revision = "0003"
down_revision = "0002"

RUN_STATUS_CHECK = (
    "status IN ('queued', 'running', 'waiting_approval', 'succeeded', 'failed', 'cancelled',"
    " 'timed_out')"
)


def upgrade() -> None:
    op.create_table(
        "agent_versions",
        sa.Column("agent_id", sa.String(32), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("definition", sa.Text(), nullable=False),
        *created(),
        at("updated_at"),
        at("published_at", nullable=True),
        by("published_by", nullable=True),
        check("agent_versions", "status", "status IN ('draft', 'published')"),
        cascade_to("agent_versions", "agent_id", "agents"),
        primary_key("agent_versions", "agent_id", "version"),
    )
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
        at("created_at"),
        at("started_at", nullable=True),
        at("ended_at", nullable=True),
        check("runs", "status", RUN_STATUS_CHECK),
        cascade_to("runs", "agent_id", "agents"),
        primary_key("runs", "id"),
    )
    create_index("runs", "agent_id")
    create_index("runs", "owner")
    op.create_table(
        "run_events",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        at("at"),
        cascade_to("run_events", "run_id", "runs"),
        primary_key("run_events", "run_id", "seq"),
    )
    op.create_table(
        "run_artifacts",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        at("created_at"),
        cascade_to("run_artifacts", "run_id", "runs"),
        primary_key("run_artifacts", "run_id", "name"),
    )
    op.create_table(
        "run_approvals",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        at("requested_at"),
        at("decided_at", nullable=True),
        by("decided_by", nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        check(
            "run_approvals",
            "status",
            "status IN ('pending', 'approved', 'denied', 'expired', 'cancelled')",
        ),
        cascade_to("run_approvals", "run_id", "runs"),
        primary_key("run_approvals", "id"),
    )
    create_index("run_approvals", "run_id")


def downgrade() -> None:
    drop_index("run_approvals", "run_id")
    op.drop_table("run_approvals")
    op.drop_table("run_artifacts")
    op.drop_table("run_events")
    drop_index("runs", "owner")
    drop_index("runs", "agent_id")
    op.drop_table("runs")
    op.drop_table("agent_versions")
