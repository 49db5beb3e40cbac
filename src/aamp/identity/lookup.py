"""The per-request identity reads, as a few plain SQL statements on one connection.

Every API request authenticates (token or session -> user) and loads the agent levels the
user's grants give, and most reads then fetch one agent. Through ORM sessions that cost about
1 ms of CPU per request (unit of work, identity map, statement cache keys) and one thread
handing the GIL back and forth per statement; here it is two statements, sent straight to the
driver. The reads are written as read plans (`aamp.store.read_plan`): on SQLite they run in
one read transaction (one snapshot: the token, the user and the grants are seen as of the
same moment), on PostgreSQL on the event loop's own connections, autocommit, READ COMMITTED
as before. Nothing is cached across requests: a revoked token, a disabled user or a removed
grant counts from the very next request, on every control-plane process sharing the database.

The SQL is written once with `:name` parameters and rendered for the driver's paramstyle
(`aamp.store.store.render`: pysqlite takes `:name`, psycopg `%(name)s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from aamp.identity.model import AgentAccess, Level
from aamp.store.store import ReadPlan

SESSION_SQL = """
SELECT s.expires_at, s.csrf_hash, u.id, u.username, u.role, u.disabled
FROM sessions s JOIN users u ON u.id = s.user_id
WHERE s.id_hash = :id_hash
"""

# Owned agents first (ownership counts as `edit`), then grants in the order they were made:
# for equal levels the first one offered is the one a decision names.
ACCESS_SQL = """
SELECT 0 AS src, a.id AS agent_id, 'edit' AS level, NULL AS grant_id, NULL AS grant_user
FROM agents a WHERE a.owner = :username
UNION ALL
SELECT 1, g.agent_id, g.level, g.id, g.user_id
FROM agent_grants g WHERE g.user_id = :user_id OR g.role = :role
ORDER BY 1, 4
"""

# The token, its user and the user's access in ONE statement (one round trip, one snapshot):
# the first eight columns are the token's and its user's, repeated on every row; the rest are
# ACCESS_SQL's (src 0 with a NULL agent_id when the user owns no agent). No row: no token.
_TOKEN_USER = """
WITH tu AS (
  SELECT t.id AS token_id, t.expires_at, t.revoked_at, t.last_used_at,
         u.id AS user_id, u.username, u.role, u.disabled
  FROM api_tokens t JOIN users u ON u.id = t.user_id
  WHERE t.token_hash = :token_hash
)
"""
TOKEN_ACCESS_SQL = (
    _TOKEN_USER
    + """
SELECT tu.*, 0 AS src, a.id AS agent_id, 'edit' AS level, NULL AS grant_id, NULL AS grant_user
FROM tu LEFT JOIN agents a ON a.owner = tu.username
UNION ALL
SELECT tu.*, 1, g.agent_id, g.level, g.id, g.user_id
FROM tu JOIN agent_grants g ON g.user_id = tu.user_id OR g.role = tu.role
ORDER BY 9, 12
"""
)

# TOKEN_ACCESS_SQL and, in the same statement, the agent a route reads (`:agent_id`): the
# commonest API read is one agent, and a statement of its own after the token's cost a
# second round trip (PostgreSQL) or read transaction (SQLite). Its row is src 2, with the
# agent's id, name, owner and created_at in columns 10, 11, 14 and 15 (AGENT_ROW); the other
# rows have NULL there. No agent row: no such agent (or no token: then there is no row).
TOKEN_ACCESS_AGENT_SQL = (
    _TOKEN_USER
    + """
SELECT tu.*, 0 AS src, a.id AS agent_id, 'edit' AS level, NULL AS grant_id, NULL AS grant_user,
       NULL AS agent_owner, NULL AS agent_created_at
FROM tu LEFT JOIN agents a ON a.owner = tu.username
UNION ALL
SELECT tu.*, 1, g.agent_id, g.level, g.id, g.user_id, NULL, NULL
FROM tu JOIN agent_grants g ON g.user_id = tu.user_id OR g.role = tu.role
UNION ALL
SELECT tu.*, 2, r.id, r.name, NULL, NULL, r.owner, r.created_at
FROM tu JOIN agents r ON r.id = :agent_id
ORDER BY 9, 12
"""
)
AGENT_SRC = 2


@dataclass(frozen=True, slots=True)
class UserFacts:
    """What authentication needs to know about a user."""

    id: int
    username: str
    role: str
    disabled: bool

    @classmethod
    def of(cls, columns: Sequence[Any]) -> UserFacts:
        """From a row's user columns as `_TOKEN_USER` and `SESSION_SQL` select them."""
        return cls(int(columns[0]), columns[1], columns[2], bool(columns[3]))


def agent_access(user: UserFacts) -> ReadPlan[MappingProxyType[str, AgentAccess]]:
    """agent id -> the best access the user's ownership and grants give (see `Actor.agents`);
    a read plan (`aamp.store.store.ReadPlan`)."""
    rows = yield ACCESS_SQL, {"username": user.username, "user_id": user.id, "role": user.role}
    return access_of(user, rows)


def access_of(user: UserFacts, rows: list[tuple[Any, ...]]) -> MappingProxyType[str, AgentAccess]:
    """`agent_access` from its rows (src, agent_id, level, grant_id, grant_user), in order."""
    best: dict[str, AgentAccess] = {}
    for src, agent_id, level_name, grant_id, grant_user in rows:
        if agent_id is None:  # TOKEN_ACCESS_SQL's row for a user who owns no agent
            continue
        if src == 0:
            access = AgentAccess(Level.EDIT, f"owner of agent:{agent_id}")
        else:
            subject = f"user {user.username}" if grant_user is not None else f"role {user.role}"
            access = AgentAccess(Level(level_name), f"grant #{grant_id} to {subject}", grant_id)
        held = best.get(agent_id)
        if held is None or access.level.rank > held.level.rank:
            best[agent_id] = access
    return MappingProxyType(best)
