"""`Directory`: users, API tokens, UI sessions and grants on agents, in the store.

Blocking methods on purpose (callers in the event loop use `await store.run(...)`, like the
rest of the store). Every method validates its input first and raises an `AampError`
naming the problem, and changes nothing when it refuses. Authentication methods return an
`Actor` already carrying the agent levels its grants give, so that `authz.allowed` is a pure
function of its three arguments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from aamp.errors import Conflict, InvalidInput, NotFound, found, matching
from aamp.identity import credentials as cred
from aamp.identity import lookup
from aamp.identity.errors import AuthenticationFailed
from aamp.identity.model import Actor, AgentAccess, Level, Role
from aamp.store import Store, added, existing, value_of
from aamp.store.store import ReadPlan, read_plan
from aamp.store.tables import AgentRow, ApiTokenRow, GrantRow, SessionRow, UserRow
from aamp.store.timestamps import format_time, now
from aamp.values import Shown

USERNAME_RE = re.compile(r"^[a-z][a-z0-9._-]{0,63}\Z")
TOKEN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}\Z")
MAX_TOKEN_DAYS = 3650
SESSION_HOURS = 12
# last_used_at is written at most this often per token: a write per request would contend
# with the audit writer for nothing.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def _parse_role(value: object) -> Role:
    try:
        return Role(str(value))
    except ValueError:
        raise InvalidInput(f"role must be one of admin, builder, operator; got {value!r}") from None


def _parse_level(value: object) -> Level:
    try:
        return Level(str(value))
    except ValueError:
        raise InvalidInput(f"level must be one of view, run, edit; got {value!r}") from None


def _password_hash(password: str) -> str:
    try:
        return cred.hash_password(password)
    except cred.PasswordPolicyError as exc:
        raise InvalidInput(str(exc)) from None


def _username(value: object) -> str:
    return matching(
        value,
        USERNAME_RE,
        "username must be 1-64 characters: a lowercase letter, then lowercase letters, "
        "digits, '.', '_' or '-'",
    )


def _stamp(moment: datetime) -> str:
    return format_time(moment)


@dataclass(frozen=True)
class UserInfo(Shown):
    hidden = ("id",)  # the database's own key: a user is named by username

    id: int
    username: str
    role: Role
    disabled: bool
    created_at: str
    created_by: str


@dataclass(frozen=True)
class TokenInfo(Shown):
    id: str
    username: str
    name: str
    created_at: str
    expires_at: str | None
    revoked_at: str | None
    last_used_at: str | None


@dataclass(frozen=True)
class GrantInfo(Shown):
    id: int
    agent_id: str
    user: str | None
    role: str | None
    level: Level
    created_at: str
    created_by: str


def _user(row: UserRow) -> UserInfo:
    return value_of(UserInfo, row, role=Role(row.role), disabled=bool(row.disabled))


def _token(row: ApiTokenRow, username: str) -> TokenInfo:
    return value_of(TokenInfo, row, username=username)


def _set_grant(s: Session, wanted: GrantRow, level: Level, by: str) -> GrantRow:
    """The agent's grant to `wanted`'s user or role (exactly one is set), created as `wanted`
    or, if there is one already, given `level` anew."""
    to = (
        GrantRow.user_id == wanted.user_id
        if wanted.user_id is not None
        else GrantRow.role == wanted.role
    )
    stmt = select(GrantRow).where(GrantRow.agent_id == wanted.agent_id, to).with_for_update()
    row = s.scalars(stmt).first()
    if row is None:
        row = wanted
        s.add(row)
    row.level, row.created_at, row.created_by = level.value, now(), by
    s.flush()
    return row


@dataclass(frozen=True)
class Directory:
    """Usage::

    directory = Directory(store)
    directory.create_user("alice", "builder", "a long password", by="user:admin")
    token, secret = directory.create_token("alice", "laptop", days=30)
    actor = directory.actor_for_token(secret)     # AuthenticationFailed if not usable
    """

    store: Store

    # -- users --------------------------------------------------------------------------

    def create_user(self, username: str, role: str, password: str, *, by: str) -> UserInfo:
        _username(username)
        parsed = _parse_role(role)
        stamp = now()
        row = UserRow(
            username=username,
            role=parsed.value,
            password_hash=_password_hash(password),
            disabled=False,
            created_at=stamp,
            created_by=by,
            updated_at=stamp,
        )
        with self.store.write_session() as s:
            return _user(added(s, row, f"a user named {username!r} already exists"))

    def list_users(self) -> list[UserInfo]:
        with self.store.session() as s:
            return [_user(r) for r in s.scalars(select(UserRow).order_by(UserRow.username))]

    def _row(self, s: Session, username: str, *, lock: bool = False) -> UserRow:
        stmt = select(UserRow).where(UserRow.username == username)
        row = s.scalars(stmt.with_for_update() if lock else stmt).first()
        return found(row, f"no user named {username!r}")

    def get_user(self, username: str) -> UserInfo:
        with self.store.session() as s:
            return _user(self._row(s, username))

    def count_admins(self) -> int:
        with self.store.session() as s:
            return len(list(s.scalars(select(UserRow.id).where(UserRow.role == "admin"))))

    def update_user(
        self, username: str, *, role: str | None = None, disabled: bool | None = None
    ) -> UserInfo:
        parsed = _parse_role(role) if role is not None else None
        with self.store.write_session() as s:
            row = self._row(s, username, lock=True)
            losing_admin = row.role == "admin" and (
                (parsed is not None and parsed is not Role.ADMIN) or disabled is True
            )
            if losing_admin:
                others = s.scalars(
                    select(UserRow.id).where(
                        UserRow.role == "admin",
                        UserRow.disabled.is_(False),
                        UserRow.id != row.id,
                    )
                ).first()
                if others is None:
                    raise Conflict(f"{username!r} is the last enabled admin; keep at least one")
            if parsed is not None:
                row.role = parsed.value
            if disabled is not None:
                row.disabled = disabled
                if disabled:
                    s.execute(delete(SessionRow).where(SessionRow.user_id == row.id))
            row.updated_at = now()
            s.flush()
            return _user(row)

    def set_password(self, username: str, password: str) -> None:
        hashed = _password_hash(password)
        with self.store.write_session() as s:
            row = self._row(s, username, lock=True)
            row.password_hash = hashed
            row.updated_at = now()
            s.execute(delete(SessionRow).where(SessionRow.user_id == row.id))

    def check_password(self, username: str, password: str) -> UserInfo:
        """The user if the password is right and the account enabled; else AuthenticationFailed.

        The message is the same for an unknown user and a wrong password (no enumeration).
        """
        with self.store.session() as s:
            row = s.scalars(select(UserRow).where(UserRow.username == username)).first()
        if row is None:
            cred.dummy_verify(password)
            raise AuthenticationFailed("wrong username or password")
        if not cred.verify_password(row.password_hash, password):
            raise AuthenticationFailed("wrong username or password")
        if row.disabled:
            raise AuthenticationFailed("this account is disabled")
        return _user(row)

    # -- API tokens ---------------------------------------------------------------------

    def create_token(
        self, username: str, name: str, *, days: int | None = None
    ) -> tuple[TokenInfo, str]:
        """A new token for `username`; the secret is returned here once and never stored."""
        matching(
            name, TOKEN_NAME_RE, "token name must be 1-64 letters, digits, spaces, '.', '_' or '-'"
        )
        if days is not None and not (isinstance(days, int) and 1 <= days <= MAX_TOKEN_DAYS):
            raise InvalidInput(f"expires_in_days must be between 1 and {MAX_TOKEN_DAYS}")
        secret = cred.new_bearer_secret()
        created = datetime.now(UTC)
        with self.store.write_session() as s:
            user = self._row(s, username)
            row = ApiTokenRow(
                id=cred.new_random_id("tok-"),
                user_id=user.id,
                name=name,
                token_hash=cred.digest(secret),
                created_at=_stamp(created),
                expires_at=_stamp(created + timedelta(days=days)) if days else None,
            )
            s.add(row)
            s.flush()
            return _token(row, username), secret

    def list_tokens(self, username: str | None = None) -> list[TokenInfo]:
        with self.store.session() as s:
            stmt = select(ApiTokenRow, UserRow.username).join(UserRow)
            if username is not None:
                stmt = stmt.where(UserRow.username == username)
            rows = s.execute(stmt.order_by(ApiTokenRow.created_at)).all()
            return [_token(t, u) for t, u in rows]

    def token_owner(self, token_id: str) -> str | None:
        with self.store.session() as s:
            return s.scalars(
                select(UserRow.username).join(ApiTokenRow).where(ApiTokenRow.id == token_id)
            ).first()

    def revoke_token(self, token_id: str) -> TokenInfo:
        with self.store.write_session() as s:
            row, username = found(
                s.execute(
                    select(ApiTokenRow, UserRow.username)
                    .join(UserRow)
                    .where(ApiTokenRow.id == token_id)
                ).first(),
                f"no token {token_id!r}",
            )
            if row.revoked_at is None:
                row.revoked_at = now()
            s.flush()
            return _token(row, username)

    def actor_for_token(self, secret: str) -> Actor:
        actor, stale = self.token_actor(secret)
        if stale:
            self.touch_token(actor.token_id or "")
        return actor

    @read_plan
    def token_actor(self, secret: str) -> ReadPlan[tuple[Actor, bool]]:
        """The token's actor, and whether its `last_used_at` is due to be written
        (`touch_token`). Reads only: the hot path of every API request (see `lookup`)."""
        actor, stale, _ = yield from self._token_plan(secret, None)
        return actor, stale

    @read_plan
    def token_actor_and_agent(
        self, secret: str, agent_id: str
    ) -> ReadPlan[tuple[Actor, bool, tuple[Any, ...] | None]]:
        """`token_actor`, and the row of agent `agent_id` (id, name, owner, created_at; None
        if there is none) read in the same statement (`lookup.TOKEN_ACCESS_AGENT_SQL`)."""
        return (yield from self._token_plan(secret, agent_id))

    def _token_plan(
        self, secret: str, agent_id: str | None
    ) -> ReadPlan[tuple[Actor, bool, tuple[Any, ...] | None]]:
        hashed = cred.digest(secret)
        moment = datetime.now(UTC)
        if agent_id is None:
            rows = yield lookup.TOKEN_ACCESS_SQL, {"token_hash": hashed}
        else:
            rows = yield lookup.TOKEN_ACCESS_AGENT_SQL, {"token_hash": hashed, "agent_id": agent_id}
        if not rows:
            raise AuthenticationFailed("the bearer token is not valid")
        token_id, expires_at, revoked_at, last_used_at, *user_fields = rows[0][:8]
        user = lookup.UserFacts.of(user_fields)
        refusal = None
        if revoked_at is not None:
            refusal = "the bearer token was revoked"
        elif expires_at is not None and expires_at <= _stamp(moment):
            refusal = "the bearer token has expired"
        elif user.disabled:
            refusal = "this account is disabled"
        if refusal is not None:
            claimed = Actor.refused(user.username, via="token", token_id=token_id)
            raise AuthenticationFailed(refusal, claimed=claimed)
        agent = None
        if agent_id is not None and rows[-1][8] == lookup.AGENT_SRC:  # last: ORDER BY src
            last = rows.pop()
            agent = (last[9], last[10], last[13], last[14])
        actor = self._new_actor(
            user, lookup.access_of(user, [r[8:13] for r in rows]), via="token", token_id=token_id
        )
        stale = last_used_at is None or last_used_at <= _stamp(moment - LAST_USED_RESOLUTION)
        return actor, stale, agent

    def touch_token(self, token_id: str) -> None:
        """Record that the token was just used."""
        with self.store.write_session() as w:
            row = w.get(ApiTokenRow, token_id)
            if row is not None:
                row.last_used_at = now()

    # -- UI sessions --------------------------------------------------------------------

    def create_session(self, user: UserInfo) -> tuple[str, str]:
        """(session secret for the cookie, CSRF token for the page); only hashes are kept."""
        session_secret = cred.new_bearer_secret()
        csrf = cred.new_bearer_secret()
        created = datetime.now(UTC)
        with self.store.write_session() as s:
            s.add(
                SessionRow(
                    id_hash=cred.digest(session_secret),
                    user_id=user.id,
                    csrf_hash=cred.digest(csrf),
                    created_at=_stamp(created),
                    expires_at=_stamp(created + timedelta(hours=SESSION_HOURS)),
                )
            )
        return session_secret, csrf

    @read_plan
    def actor_for_session(self, secret: str) -> ReadPlan[tuple[Actor, str]]:
        """The session's actor and its CSRF token hash; AuthenticationFailed if unusable."""
        rows = yield lookup.SESSION_SQL, {"id_hash": cred.digest(secret)}
        if not rows:
            raise AuthenticationFailed("the session is not valid; sign in again")
        expires_at, csrf_hash, *user_fields = rows[0]
        user = lookup.UserFacts.of(user_fields)
        claimed = Actor.refused(user.username, via="session")
        if expires_at <= now():
            raise AuthenticationFailed("the session has expired; sign in again", claimed=claimed)
        if user.disabled:
            raise AuthenticationFailed("this account is disabled", claimed=claimed)
        actor = yield from self._actor_plan(user, via="session")
        return actor, csrf_hash

    def delete_session(self, secret: str) -> None:
        with self.store.write_session() as s:
            s.execute(delete(SessionRow).where(SessionRow.id_hash == cred.digest(secret)))

    # -- actors -------------------------------------------------------------------------

    def actor_for_user(self, username: str) -> Actor:
        """The actor a user would be (used by tools and tests that act as a user directly)."""
        with self.store.session() as s:
            return self._actor(s, self._row(s, username), via="direct")

    def _actor(self, s: Session, user: UserRow, *, via: str, token_id: str | None = None) -> Actor:
        facts = lookup.UserFacts(user.id, user.username, user.role, bool(user.disabled))
        return self.store.run_plan(
            self._actor_plan(facts, via=via, token_id=token_id), s.connection()
        )

    def _actor_plan(
        self, user: lookup.UserFacts, *, via: str, token_id: str | None = None
    ) -> ReadPlan[Actor]:
        agents = yield from lookup.agent_access(user)
        return self._new_actor(user, agents, via=via, token_id=token_id)

    @staticmethod
    def _new_actor(
        user: lookup.UserFacts,
        agents: MappingProxyType[str, AgentAccess],
        *,
        via: str,
        token_id: str | None = None,
    ) -> Actor:
        return Actor(
            username=user.username,
            role=Role(user.role),
            user_id=user.id,
            via=via,
            token_id=token_id,
            agents=agents,
        )

    # -- grants on agents ---------------------------------------------------------------

    def grant_user(self, agent_id: str, username: str, *, level: str, by: str) -> GrantInfo:
        """Give user `username` `level` on the agent; replaces an earlier grant to them."""
        parsed = _parse_level(level)
        with self.store.write_session() as s:
            existing(s, AgentRow, agent_id, f"no agent {agent_id!r}")
            user_id = self._row(s, _username(username)).id
            row = _set_grant(s, GrantRow(agent_id=agent_id, user_id=user_id), parsed, by)
            return GrantInfo(row.id, agent_id, username, None, parsed, row.created_at, by)

    def grant_role(self, agent_id: str, role: str, *, level: str, by: str) -> GrantInfo:
        """Give every user of `role` `level` on the agent; replaces an earlier grant to it."""
        parsed, parsed_role = _parse_level(level), _parse_role(role)
        with self.store.write_session() as s:
            existing(s, AgentRow, agent_id, f"no agent {agent_id!r}")
            row = _set_grant(s, GrantRow(agent_id=agent_id, role=parsed_role.value), parsed, by)
            return GrantInfo(row.id, agent_id, None, row.role, parsed, row.created_at, by)

    def list_grants(self, agent_id: str) -> list[GrantInfo]:
        with self.store.session() as s:
            rows = s.execute(
                select(GrantRow, UserRow.username)
                .outerjoin(UserRow, GrantRow.user_id == UserRow.id)
                .where(GrantRow.agent_id == agent_id)
                .order_by(GrantRow.id)
            ).all()
            return [
                GrantInfo(g.id, g.agent_id, u, g.role, Level(g.level), g.created_at, g.created_by)
                for g, u in rows
            ]

    def revoke_grant(self, agent_id: str, grant_id: int) -> None:
        with self.store.write_session() as s:
            row = s.get(GrantRow, grant_id)
            if row is None or row.agent_id != agent_id:
                raise NotFound(f"no grant #{grant_id} on agent {agent_id!r}")
            s.delete(row)
