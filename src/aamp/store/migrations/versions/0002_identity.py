"""Identity (users, API tokens, sessions, agent grants), agents, policies and services.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _stamps(*, updated: bool = True) -> list[sa.Column]:
    cols = [
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("created_by", sa.String(256), nullable=False),
    ]
    if updated:
        cols += [
            sa.Column("updated_at", sa.String(32), nullable=False),
            sa.Column("updated_by", sa.String(256), nullable=False),
        ]
    return cols


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("password_hash", sa.String(256), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("created_by", sa.String(256), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
        sa.CheckConstraint("role IN ('admin', 'builder', 'operator')", name=op.f("ck_users_role")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("username", name=op.f("uq_users_username")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("expires_at", sa.String(32), nullable=True),
        sa.Column("revoked_at", sa.String(32), nullable=True),
        sa.Column("last_used_at", sa.String(32), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_api_tokens_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_index("ix_api_tokens_user_id", "api_tokens", ["user_id"])
    op.create_table(
        "sessions",
        sa.Column("id_hash", sa.String(64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("csrf_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("expires_at", sa.String(32), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_sessions_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_sessions")),
    )
    op.create_index("ix_sessions_user_id", "sessions", ["user_id"])
    op.create_table(
        "agents",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agents")),
        sa.UniqueConstraint("name", name=op.f("uq_agents_name")),
    )
    op.create_table(
        "agent_grants",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("agent_id", sa.String(32), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("role", sa.String(16), nullable=True),
        sa.Column("level", sa.String(8), nullable=False),
        *_stamps(updated=False),
        sa.CheckConstraint(
            "(user_id IS NULL) <> (role IS NULL)", name=op.f("ck_agent_grants_one_subject")
        ),
        sa.CheckConstraint("level IN ('view', 'run', 'edit')", name=op.f("ck_agent_grants_level")),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_agent_grants_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_agent_grants_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_grants")),
        sa.UniqueConstraint("agent_id", "user_id", name="uq_agent_grants_agent_user"),
        sa.UniqueConstraint("agent_id", "role", name="uq_agent_grants_agent_role"),
    )
    op.create_index("ix_agent_grants_user_id", "agent_grants", ["user_id"])
    op.create_index("ix_agent_grants_role", "agent_grants", ["role"])
    op.create_table(
        "agent_resources",
        sa.Column("agent_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        *_stamps(updated=False),
        sa.CheckConstraint(
            "kind IN ('policy', 'service', 'image')", name=op.f("ck_agent_resources_kind")
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_agent_resources_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("agent_id", "kind", "name", name=op.f("pk_agent_resources")),
    )
    op.create_table(
        "policies",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("format", sa.String(8), nullable=False),
        *_stamps(),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_policies")),
    )
    op.create_table(
        "services",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("upstream", sa.String(512), nullable=False),
        sa.Column("auth_kind", sa.String(16), nullable=False),
        sa.Column("header_name", sa.String(128), nullable=True),
        sa.Column("secret_names", sa.Text(), nullable=False),
        *_stamps(),
        sa.CheckConstraint(
            "auth_kind IN ('bearer', 'basic', 'header')", name=op.f("ck_services_auth_kind")
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_services")),
    )


def downgrade() -> None:
    op.drop_table("services")
    op.drop_table("policies")
    op.drop_table("agent_resources")
    op.drop_index("ix_agent_grants_role", table_name="agent_grants")
    op.drop_index("ix_agent_grants_user_id", table_name="agent_grants")
    op.drop_table("agent_grants")
    op.drop_table("agents")
    op.drop_index("ix_sessions_user_id", table_name="sessions")
    op.drop_table("sessions")
    op.drop_index("ix_api_tokens_user_id", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("users")
