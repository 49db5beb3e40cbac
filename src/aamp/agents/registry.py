"""`AgentRegistry`: the agents themselves — create, list, read, delete.

An agent is a name, an id and an owner (its creator, which counts as `edit` on it); what it
does is its definition over time (`versions.py`), who may use it is identity's grants, what
it may use is the catalog's. Blocking methods, run through `Store.run` like the rest of the
store; `find` and `get` are read plans (`aamp.store.read_plan`), since most API requests read
one agent. Every method validates its input first and changes nothing when it refuses.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from sqlalchemy import delete, select

from aamp.errors import found, matching
from aamp.store import Store, added, existing, value_of
from aamp.store.store import ReadPlan, read_plan
from aamp.store.tables import AgentRow, GrantRow
from aamp.store.timestamps import now
from aamp.values import Shown

AGENT_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?\Z")
AGENT_SQL = "SELECT id, name, owner, created_at FROM agents WHERE id = :agent_id"


@dataclass(frozen=True)
class AgentInfo(Shown):
    id: str
    name: str
    owner: str
    created_at: str


def _agent(row: AgentRow) -> AgentInfo:
    return value_of(AgentInfo, row)


@dataclass(frozen=True)
class AgentRegistry:
    """Usage::

    agents = AgentRegistry(store)
    agent = agents.create("finance", owner="alice")
    await store.run(agents.get, agent.id)      # NotFound if there is none
    """

    store: Store

    def create(self, name: str, *, owner: str) -> AgentInfo:
        matching(
            name,
            AGENT_NAME_RE,
            "agent name must be 1-64 lowercase letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit",
        )
        with self.store.write_session() as s:
            row = AgentRow(
                id=f"ag-{secrets.token_hex(6)}", name=name, owner=owner, created_at=now()
            )
            return _agent(added(s, row, f"an agent named {name!r} already exists"))

    def list(self) -> list[AgentInfo]:
        with self.store.session() as s:
            return [_agent(r) for r in s.scalars(select(AgentRow).order_by(AgentRow.name))]

    def _find_plan(self, agent_id: str) -> ReadPlan[AgentInfo | None]:
        if not isinstance(agent_id, str):
            return None
        rows = yield AGENT_SQL, {"agent_id": agent_id}
        return AgentInfo(*rows[0]) if rows else None

    find = read_plan(_find_plan)

    @read_plan
    def get(self, agent_id: str) -> ReadPlan[AgentInfo]:
        agent = yield from self._find_plan(agent_id)
        return found(agent, f"no agent {agent_id!r}")

    def delete(self, agent_id: str) -> None:
        """Delete the agent and the grants on it."""
        with self.store.write_session() as s:
            existing(s, AgentRow, agent_id, f"no agent {agent_id!r}")
            s.execute(delete(GrantRow).where(GrantRow.agent_id == agent_id))
            s.execute(delete(AgentRow).where(AgentRow.id == agent_id))
