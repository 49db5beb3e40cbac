"""Admin-defined policies (their source document, validated by `aamp.policy`), services and
model endpoints.

A service names an upstream origin, how to authenticate to it and the names of the secrets
that hold the credentials (JSON list); the values stay in the vault, the egress proxy injects
them. A model endpoint names an OpenAI-compatible base URL, the secret holding its API key
and the model names it serves (JSON list); `confirmed` is false for the endpoints migration
0005 made from agents' inline URLs until an admin confirms them. Nothing here ever holds a
secret value.
"""

from __future__ import annotations

from sqlalchemy import Boolean, CheckConstraint, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from aamp.store.tables.base import Base


class PolicyRow(Base):
    __tablename__ = "policies"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    source: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(256))
    updated_at: Mapped[str] = mapped_column(String(32))
    updated_by: Mapped[str] = mapped_column(String(256))


class ServiceRow(Base):
    __tablename__ = "services"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    upstream: Mapped[str] = mapped_column(String(512))
    auth_kind: Mapped[str] = mapped_column(String(16))
    header_name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    secret_names: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(256))
    updated_at: Mapped[str] = mapped_column(String(32))
    updated_by: Mapped[str] = mapped_column(String(256))

    __table_args__ = (
        CheckConstraint("auth_kind IN ('bearer', 'basic', 'header')", name="auth_kind"),
    )


class ModelEndpointRow(Base):
    __tablename__ = "model_endpoints"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    base_url: Mapped[str] = mapped_column(String(512))
    api_key_secret: Mapped[str | None] = mapped_column(String(64), nullable=True)
    models: Mapped[str] = mapped_column(Text)
    confirmed: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(256))
    updated_at: Mapped[str] = mapped_column(String(32))
    updated_by: Mapped[str] = mapped_column(String(256))
    confirmed_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    confirmed_by: Mapped[str | None] = mapped_column(String(256), nullable=True)
