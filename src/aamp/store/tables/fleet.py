"""The fleet: sandbox hosts registered with the control plane (see `aamp.fleet`).

A host row is made by an admin (`aamp host add`: its token is shown once and stored only as
its SHA-256) and filled in by the host at each registration: its epoch (one more at every
registration, so work addressed to an earlier life of the host can be told apart), drivers,
capacity and images, and its heartbeat. `used_*` is the capacity placements reserved.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from aamp.store.tables.base import Base

HOST_STATES = ("new", "active", "draining", "lost")


class HostRow(Base):
    __tablename__ = "hosts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16))
    drivers: Mapped[str] = mapped_column(Text, default="[]")  # JSON list
    images: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of name@hash
    millicpus: Mapped[int] = mapped_column(Integer, default=0)  # a policy's cpus may be 0.5
    memory_mb: Mapped[int] = mapped_column(Integer, default=0)
    sandboxes: Mapped[int] = mapped_column(Integer, default=0)
    used_millicpus: Mapped[int] = mapped_column(Integer, default=0)
    used_memory_mb: Mapped[int] = mapped_column(Integer, default=0)
    used_sandboxes: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(256))
    # Where its link listens (HOST:PORT); None for a replica's own host, driven in-process.
    link_address: Mapped[str | None] = mapped_column(String(300), nullable=True)
    # SHA-256 of the heartbeat secret its current registration was given; None before one.
    heartbeat_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)

    __table_args__ = (
        CheckConstraint("state IN (" + ", ".join(f"'{s}'" for s in HOST_STATES) + ")", "state"),
    )


SANDBOX_STATES = ("live", "lost")


class SandboxRow(Base):
    """A sandbox placed on a host: which host and which life (epoch) of it, and what it
    reserved there (given back when the sandbox is destroyed). `lost` when its host was
    marked lost; a host's next registration forgets the rows of its earlier lives."""

    __tablename__ = "sandboxes"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host_id: Mapped[str] = mapped_column(String(64), index=True)
    host_epoch: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    millicpus: Mapped[int] = mapped_column(Integer)
    memory_mb: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[str] = mapped_column(String(32))
    # Its create's time plus its ttl: past it, its host is refused every credential and
    # report for it, and the sweep reaps it (`fleet/sandboxes.py`).
    expires_at: Mapped[str] = mapped_column(String(32), index=True)
    lost_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Who made it, for which agent and policy: what any replica's authorisation needs.
    owner: Mapped[str | None] = mapped_column(String(256), nullable=True)
    agent: Mapped[str | None] = mapped_column(String(64), nullable=True)
    policy: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Its policy's data rules (JSON, `DataPolicy.to_json`): what its files in and out are
    # checked against on every replica. None for an admin's sandbox made without a policy.
    data_rules: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The services its create was granted (a JSON list of names): the only ones its host is
    # ever given a credential for (`fleet/credentials.py`).
    services: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (
        CheckConstraint("state IN (" + ", ".join(f"'{s}'" for s in SANDBOX_STATES) + ")", "state"),
    )
