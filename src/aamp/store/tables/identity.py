"""Tables of identity: users, API tokens, UI sessions and per-agent grants (see `aamp.identity`).

Credentials are never stored: passwords as argon2id hashes, API tokens and session ids as the
SHA-256 of a 256-bit random value (a fast hash is enough for an unguessable token; a slow one
would only slow every request). A grant gives either one user or one whole role a level on one
agent; the check constraint keeps it to exactly one subject. `login_failures` holds one row per
key (`user:NAME`, `addr:ADDRESS`) per failed login inside the throttle's window, so every
control-plane replica on one database counts the same failures (`aamp.identity.throttle`).
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from aamp.store.tables.base import Base


class UserRow(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    password_hash: Mapped[str] = mapped_column(String(256))
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(256))
    updated_at: Mapped[str] = mapped_column(String(32))

    __table_args__ = (CheckConstraint("role IN ('admin', 'builder', 'operator')", name="role"),)


class ApiTokenRow(Base):
    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[str] = mapped_column(String(32))
    expires_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    revoked_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    last_used_at: Mapped[str | None] = mapped_column(String(32), nullable=True)

    __table_args__ = (Index("ix_api_tokens_user_id", "user_id"),)


class SessionRow(Base):
    __tablename__ = "sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    csrf_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[str] = mapped_column(String(32))
    expires_at: Mapped[str] = mapped_column(String(32))

    __table_args__ = (Index("ix_sessions_user_id", "user_id"),)


class GrantRow(Base):
    __tablename__ = "agent_grants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), nullable=True
    )
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    level: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(256))

    __table_args__ = (
        CheckConstraint("(user_id IS NULL) <> (role IS NULL)", name="one_subject"),
        CheckConstraint("level IN ('view', 'run', 'edit')", name="level"),
        UniqueConstraint("agent_id", "user_id", name="uq_agent_grants_agent_user"),
        UniqueConstraint("agent_id", "role", name="uq_agent_grants_agent_role"),
        Index("ix_agent_grants_user_id", "user_id"),
        Index("ix_agent_grants_role", "role"),
    )


class LoginFailureRow(Base):
    __tablename__ = "login_failures"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(320))
    at: Mapped[str] = mapped_column(String(32))

    __table_args__ = (
        Index("ix_login_failures_key_at", "key", "at"),
        Index("ix_login_failures_at", "at"),
    )
