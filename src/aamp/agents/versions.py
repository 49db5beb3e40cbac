"""`AgentVersions`: an agent's definitions over time. Edits go to the one draft; `publish`
freezes the draft as the next published version, which never changes again.

Below `edit` only published versions are read and run (decided by `aamp.identity.authz`);
builders with `edit` may test-run the draft. A run
records the version it ran, so what an agent did can always be read back exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from aamp.agents.definition import AgentDefinition, definition_from_dict, stored_form
from aamp.errors import Conflict, NotFound
from aamp.store import Store, existing, value_of
from aamp.store.tables import AgentRow, AgentVersionRow
from aamp.store.timestamps import now


@dataclass(frozen=True)
class AgentVersion:
    agent_id: str
    version: int
    status: str
    definition: AgentDefinition
    created_at: str
    created_by: str
    updated_at: str
    published_at: str | None
    published_by: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "version": self.version,
            "status": self.status,
            "definition": json.loads(stored_form(self.definition)),
            "created_at": self.created_at,
            "created_by": self.created_by,
            "updated_at": self.updated_at,
            "published_at": self.published_at,
            "published_by": self.published_by,
        }


def _version(row: AgentVersionRow) -> AgentVersion:
    return value_of(AgentVersion, row, definition=definition_from_dict(json.loads(row.definition)))


@dataclass(frozen=True)
class AgentVersions:
    store: Store

    def save_draft(self, agent_id: str, definition: AgentDefinition, *, by: str) -> AgentVersion:
        """Replace the draft, or start one as the version after the newest."""
        with self.store.write_session() as s:
            existing(s, AgentRow, agent_id, f"no agent {agent_id!r}")
            row = s.scalars(
                select(AgentVersionRow).where(
                    AgentVersionRow.agent_id == agent_id, AgentVersionRow.status == "draft"
                )
            ).first()
            stamp = now()
            if row is None:
                newest = s.scalar(
                    select(func.max(AgentVersionRow.version)).where(
                        AgentVersionRow.agent_id == agent_id
                    )
                )
                row = AgentVersionRow(
                    agent_id=agent_id,
                    version=(newest or 0) + 1,
                    status="draft",
                    created_at=stamp,
                    created_by=by,
                )
                s.add(row)
            row.definition = stored_form(definition)
            row.updated_at = stamp
            s.flush()
            return _version(row)

    def publish(self, agent_id: str, *, by: str) -> AgentVersion:
        with self.store.write_session() as s:
            existing(s, AgentRow, agent_id, f"no agent {agent_id!r}")
            row = s.scalars(
                select(AgentVersionRow)
                .where(AgentVersionRow.agent_id == agent_id, AgentVersionRow.status == "draft")
                .with_for_update()
            ).first()
            if row is None:
                raise Conflict(f"agent {agent_id!r} has no draft to publish; edit it first")
            row.status = "published"
            row.published_at, row.published_by = now(), by
            s.flush()
            return _version(row)

    def list(self, agent_id: str, *, drafts: bool) -> list[AgentVersion]:
        with self.store.session() as s:
            q = select(AgentVersionRow).where(AgentVersionRow.agent_id == agent_id)
            if not drafts:
                q = q.where(AgentVersionRow.status == "published")
            return [_version(r) for r in s.scalars(q.order_by(AgentVersionRow.version))]

    def find(self, agent_id: str, which: str | int) -> AgentVersion | None:
        """A version by number, `draft`, or `latest` (the newest published one); None if the
        agent has no such version."""
        with self.store.session() as s:
            q = select(AgentVersionRow).where(AgentVersionRow.agent_id == agent_id)
            if which == "draft":
                q = q.where(AgentVersionRow.status == "draft")
            elif which == "latest":
                q = q.where(AgentVersionRow.status == "published").order_by(
                    AgentVersionRow.version.desc()
                )
            else:
                q = q.where(AgentVersionRow.version == int(which))
            row = s.scalars(q.limit(1)).first()
            return _version(row) if row is not None else None

    def get(self, agent_id: str, which: str | int) -> AgentVersion:
        """As `find`, but NotFound (naming what is missing) instead of None."""
        found = self.find(agent_id, which)
        if found is None:
            raise NotFound(missing_version(agent_id, which))
        return found


def missing_version(agent_id: str, which: str | int) -> str:
    what = {"draft": "no draft", "latest": "no published version"}.get(
        str(which), f"no version {which}"
    )
    return f"agent {agent_id!r} has {what}"
