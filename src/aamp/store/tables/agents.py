"""Agents as grant targets, and the resources an admin grants to each agent.

Only what grants need for now (id, name, owner, created); the agents issue extends the table
with the versioned definition. `agent_resources` says which policies, services, images and
model endpoints an agent may use: a sandbox or run for an agent uses only what is listed here.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from aamp.store.tables.base import Base


class AgentRow(Base):
    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    owner: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[str] = mapped_column(String(32))

    # Every request's grants statement finds the agents its user owns (identity/lookup.py).
    __table_args__ = (Index("ix_agents_owner", "owner"),)


class AgentResourceRow(Base):
    __tablename__ = "agent_resources"

    agent_id: Mapped[str] = mapped_column(
        ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True
    )
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(256))

    __table_args__ = (
        CheckConstraint(
            "kind IN ('policy', 'service', 'image', 'model-endpoint', 'knowledge-base')",
            name="kind",
        ),
    )
