"""The small frozen values every authorisation decision is made of.

Roles (exactly three), grant levels (ordered: edit implies run implies view), the `Actor`
making a request with the agent levels its grants give it, the `Resource` it acts on with the
facts a decision needs, and the `Decision` that comes back with its reason and the grant that
allowed it (stored in the audit record). Datasette's permissions module is the model: plain
dataclasses in, one decision with a reason out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


class Role(StrEnum):
    ADMIN = "admin"
    BUILDER = "builder"
    OPERATOR = "operator"


class Level(StrEnum):
    VIEW = "view"
    RUN = "run"
    EDIT = "edit"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def implies(self, other: Level) -> bool:
        return self.rank >= other.rank


_RANK = {Level.VIEW: 1, Level.RUN: 2, Level.EDIT: 3}

# Operators run what they are granted; whatever a grant says, they never edit an agent.
ROLE_CEILING = {Role.ADMIN: Level.EDIT, Role.BUILDER: Level.EDIT, Role.OPERATOR: Level.RUN}


@dataclass(frozen=True)
class AgentAccess:
    """An actor's level on one agent and where it comes from (for the decision's reason)."""

    level: Level
    source: str
    grant_id: int | None = None


@dataclass(frozen=True)
class Actor:
    """Who makes a request. `agents` maps agent id -> the best access its grants give."""

    username: str | None
    role: Role | None
    user_id: int | None = None
    via: str = "anonymous"  # "token" | "session" | "anonymous"
    token_id: str | None = None
    agents: Mapping[str, AgentAccess] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def authenticated(self) -> bool:
        return self.username is not None and self.role is not None

    @property
    def audit_name(self) -> str:
        return f"user:{self.username}" if self.username else "anonymous"

    @classmethod
    def anonymous(cls) -> Actor:
        return cls(None, None)

    @classmethod
    def refused(cls, username: str, *, via: str, token_id: str | None = None) -> Actor:
        """Whom a credential that cannot be used names: no role, so never signed in; only
        the audit record of the refusal carries it."""
        return cls(username, None, via=via, token_id=token_id)


ANONYMOUS = Actor(None, None)


@dataclass(frozen=True)
class Resource:
    """What an action is about, with the facts `allowed` needs and nothing else.

    - `owner`: the username that owns it (a token, a sandbox), when that matters;
    - `agent`: the agent it belongs to (a sandbox, a grant, a run), or that it is;
    - `subject_user` / `subject_role`: who a grant being made or a user being changed is;
    - `admin_only`: why only an admin may make this request as asked (a policy given inline,
      a sandbox made without a policy), or None;
    - `ungranted`: what the request would make the agent use that an admin has not granted
      it (`policy:NAME`, `image:NAME`, `service:NAME`), in the order they were found;
    - `unpublished`: the agent version asked for, when it is not a published one (`draft`,
      or a number that is a draft or no version at all), or None;
    - `unconfirmed`: the model endpoint a run would use, when an admin has not confirmed it
      yet (migration 0005 made it from the agent's former inline URL), or None;
    - `data_refused`: why the data rules of the policy a sandbox was made from refuse the
      file going in or out (its type, its size, an approval it would need), or None.
    """

    kind: str
    id: str = ""
    owner: str | None = None
    agent: str | None = None
    subject_user: str | None = None
    subject_role: str | None = None
    admin_only: str | None = None
    ungranted: tuple[str, ...] = ()
    unpublished: str | None = None
    unconfirmed: str | None = None
    data_refused: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}" if self.id else self.kind


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    grant_id: int | None = None

    @property
    def word(self) -> str:
        return "allow" if self.allowed else "deny"
