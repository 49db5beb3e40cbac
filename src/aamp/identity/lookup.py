"""The per-request identity reads, as a few plain SQL statements on one connection.

Every API request authenticates (token or session -> user) and loads the agent levels the
user's grants give, and most reads then fetch one agent. Through ORM sessions that cost about
1 ms of CPU per request (unit of work, identity map, statement cache keys) and one thread
handing the GIL back and forth per statement; here it is two statements, sent straight to the
driver, in one read transaction (one snapshot: the token, the user and the grants are seen as
of the same moment, exactly as the ORM version saw them). Nothing is cached across requests:
a revoked token, a disabled user or a removed grant counts from the very next request, on
every control-plane process sharing the database.

The SQL is written once with `:name` parameters and rendered for the driver's paramstyle
(pysqlite takes `:name`, psycopg `%(name)s`; the store only ever meets these two).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from sqlalchemy import Connection

from aamp.identity.model import AgentAccess, Level

_PARAM = re.compile(r":([a-z_]+)")

TOKEN_SQL = """
SELECT t.id, t.expires_at, t.revoked_at, t.last_used_at, u.id, u.username, u.role, u.disabled
FROM api_tokens t JOIN users u ON u.id = t.user_id
WHERE t.token_hash = :token_hash
"""

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

AGENT_SQL = "SELECT id, name, owner, created_at FROM agents WHERE id = :agent_id"


@lru_cache(maxsize=64)
def render(sql: str, driver: str) -> str:
    """`sql` with its `:name` parameters as the driver takes named parameters."""
    if driver == "pysqlite":
        return sql
    if driver == "psycopg":
        return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))
    raise ValueError(f"unsupported database driver {driver!r}")


def query(conn: Connection, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Rows of `sql` (written with `:name` parameters), run on the driver's own cursor inside
    `conn`'s transaction (`Store.read_connection`): no SQLAlchemy statement machinery, which
    cost more CPU than the query itself."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(render(sql, conn.dialect.driver), params)
        return [tuple(r) for r in cursor.fetchall()]
    finally:
        cursor.close()


@dataclass(frozen=True, slots=True)
class UserFacts:
    """What authentication needs to know about a user."""

    id: int
    username: str
    role: str
    disabled: bool


def agent_access(conn: Connection, user: UserFacts) -> MappingProxyType[str, AgentAccess]:
    """agent id -> the best access the user's ownership and grants give (see `Actor.agents`)."""
    best: dict[str, AgentAccess] = {}
    rows = query(conn, ACCESS_SQL, username=user.username, user_id=user.id, role=user.role)
    for src, agent_id, level_name, grant_id, grant_user in rows:
        if src == 0:
            access = AgentAccess(Level.EDIT, f"owner of agent:{agent_id}")
        else:
            subject = f"user {user.username}" if grant_user is not None else f"role {user.role}"
            access = AgentAccess(Level(level_name), f"grant #{grant_id} to {subject}", grant_id)
        held = best.get(agent_id)
        if held is None or access.level.rank > held.level.rank:
            best[agent_id] = access
    return MappingProxyType(best)
