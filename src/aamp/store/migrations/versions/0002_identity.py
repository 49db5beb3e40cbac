"""Identity (users, API tokens, sessions, agent grants), agents, policies and services."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from aamp.store.migrations.shapes import (
    at,
    cascade_to,
    check,
    create_index,
    created,
    drop_index,
    primary_key,
    stamped,
)

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("username", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("password_hash", sa.String(256), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        *created(),
        at("updated_at"),
        check("users", "role", "role IN ('admin', 'builder', 'operator')"),
        primary_key("users", "id"),
        sa.UniqueConstraint("username", name=op.f("uq_users_username")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        at("created_at"),
        at("expires_at", nullable=True),
        at("revoked_at", nullable=True),
        at("last_used_at", nullable=True),
        cascade_to("api_tokens", "user_id", "users"),
        primary_key("api_tokens", "id"),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    create_index("api_tokens", "user_id")
    op.create_table(
        "sessions",
        sa.Column("id_hash", sa.String(64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("csrf_hash", sa.String(64), nullable=False),
        at("created_at"),
        at("expires_at"),
        cascade_to("sessions", "user_id", "users"),
        primary_key("sessions", "id_hash"),
    )
    create_index("sessions", "user_id")
    op.create_table(
        "agents",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        at("created_at"),
        primary_key("agents", "id"),
        sa.UniqueConstraint("name", name=op.f("uq_agents_name")),
    )
    op.create_table(
        "agent_grants",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("agent_id", sa.String(32), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("role", sa.String(16), nullable=True),
        sa.Column("level", sa.String(8), nullable=False),
        *created(),
        check("agent_grants", "one_subject", "(user_id IS NULL) <> (role IS NULL)"),
        check("agent_grants", "level", "level IN ('view', 'run', 'edit')"),
        cascade_to("agent_grants", "agent_id", "agents"),
        cascade_to("agent_grants", "user_id", "users"),
        primary_key("agent_grants", "id"),
        sa.UniqueConstraint("agent_id", "user_id", name="uq_agent_grants_agent_user"),
        sa.UniqueConstraint("agent_id", "role", name="uq_agent_grants_agent_role"),
    )
    create_index("agent_grants", "user_id")
    create_index("agent_grants", "role")
    op.create_table(
        "agent_resources",
        sa.Column("agent_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        *created(),
        check("agent_resources", "kind", "kind IN ('policy', 'service', 'image')"),
        cascade_to("agent_resources", "agent_id", "agents"),
        primary_key("agent_resources", "agent_id", "kind", "name"),
    )
    op.create_table(
        "policies",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("format", sa.String(8), nullable=False),
        *stamped(),
        primary_key("policies", "name"),
    )
    op.create_table(
        "services",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("upstream", sa.String(512), nullable=False),
        sa.Column("auth_kind", sa.String(16), nullable=False),
        sa.Column("header_name", sa.String(128), nullable=True),
        sa.Column("secret_names", sa.Text(), nullable=False),
        *stamped(),
        check("services", "auth_kind", "auth_kind IN ('bearer', 'basic', 'header')"),
        primary_key("services", "name"),
    )


def downgrade() -> None:
    op.drop_table("services")
    op.drop_table("policies")
    op.drop_table("agent_resources")
    drop_index("agent_grants", "role")
    drop_index("agent_grants", "user_id")
    op.drop_table("agent_grants")
    op.drop_table("agents")
    drop_index("sessions", "user_id")
    op.drop_table("sessions")
    drop_index("api_tokens", "user_id")
    op.drop_table("api_tokens")
    op.drop_table("users")
