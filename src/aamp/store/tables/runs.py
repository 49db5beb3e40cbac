"""Versioned agent definitions, runs, their steps (events), artifacts and approvals.

`agent_versions` holds every version of an agent's definition as the JSON the builder wrote
(validated on the way in); at most one version per agent is a `draft`, the others are
`published` and never change again. A run names the exact version it ran. `run_events` is the
run's step log: the live stream is read from it, so a step that was streamed is always stored
first (and survives a restart). Artifact bytes live on disk under $AAMP_HOME, content-addressed;
the row keeps size and SHA-256.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from aamp.store.tables.base import Base

RUN_STATUSES = (
    "queued",
    "running",
    "waiting_approval",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
)


class AgentVersionRow(Base):
    __tablename__ = "agent_versions"

    agent_id: Mapped[str] = mapped_column(
        ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    status: Mapped[str] = mapped_column(String(16))
    definition: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(256))
    updated_at: Mapped[str] = mapped_column(String(32))
    published_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    published_by: Mapped[str | None] = mapped_column(String(256), nullable=True)

    __table_args__ = (CheckConstraint("status IN ('draft', 'published')", name="status"),)


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str] = mapped_column(String(64))
    task: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    sandbox_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    ended_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # Which control-plane replica drives the run, until when (`aamp.runs.leases`).
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_until: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    # One more at every take or takeover; the driver's writes name it (fencing, 0011).
    lease_epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Who asked to cancel the run, for its driver on whichever replica (0014).
    cancel_requested_by: Mapped[str | None] = mapped_column(String(255), nullable=True)

    # The history's order (newest first) after each filter it takes, so a page is an index
    # range read in order (migration 0006); the prefixes serve plain lookups too.
    __table_args__ = (
        CheckConstraint("status IN (" + ", ".join(f"'{s}'" for s in RUN_STATUSES) + ")", "status"),
        Index("ix_runs_created", "created_at", "id"),
        Index("ix_runs_owner_created", "owner", "created_at", "id"),
        Index("ix_runs_agent_created", "agent_id", "created_at", "id"),
        Index("ix_runs_status_created", "status", "created_at", "id"),
        Index("ix_runs_agent_status_created", "agent_id", "status", "created_at", "id"),
    )


class RunEventRow(Base):
    __tablename__ = "run_events"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    type: Mapped[str] = mapped_column(String(32))
    data: Mapped[str] = mapped_column(Text)
    at: Mapped[str] = mapped_column(String(32))


class RunInputRow(Base):
    """A run's input file, kept until the run ends so that a takeover can put it again."""

    __tablename__ = "run_inputs"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(255))
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RunArtifactRow(Base):
    __tablename__ = "run_artifacts"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[str] = mapped_column(String(32))


class RunApprovalRow(Base):
    __tablename__ = "run_approvals"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    requested_at: Mapped[str] = mapped_column(String(32))
    decided_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    decided_by: Mapped[str | None] = mapped_column(String(256), nullable=True)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (
        CheckConstraint(
            "status IN ('pending', 'approved', 'denied', 'expired', 'cancelled')", "status"
        ),
        Index("ix_run_approvals_run_id", "run_id"),
    )
