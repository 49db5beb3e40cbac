"""The directory on SQLite and on a real PostgreSQL: users, roles, tokens, grants."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from aamp.agents.registry import AgentRegistry
from aamp.errors import Conflict, InvalidInput
from aamp.identity import Directory, LoginThrottle, Throttled
from aamp.identity.bootstrap import ensure_cli_token, ensure_first_admin
from aamp.identity.errors import AuthenticationFailed
from aamp.store import Store


@pytest.fixture
def directory(database_url: str):
    store = Store.from_url(database_url)
    yield Directory(store)
    store.close()


def test_users_roles_and_passwords(directory: Directory) -> None:
    directory.create_user("alice", "builder", "alice-password-1", by="t")
    with pytest.raises(Conflict):
        directory.create_user("alice", "operator", "alice-password-1", by="t")
    with pytest.raises(InvalidInput, match="role must be one of"):
        directory.create_user("carol", "root", "carol-password-1", by="t")
    with pytest.raises(InvalidInput, match="at least 12"):
        directory.create_user("carol", "operator", "short", by="t")
    assert directory.check_password("alice", "alice-password-1").role.value == "builder"
    with pytest.raises(AuthenticationFailed, match="wrong username or password"):
        directory.check_password("alice", "wrong-password")
    with pytest.raises(AuthenticationFailed, match="wrong username or password"):
        directory.check_password("nobody", "whatever-password")
    stored = (
        directory.store.engine.connect().exec_driver_sql("SELECT password_hash FROM users").scalar()
    )
    assert stored.startswith("$argon2id$") and "alice-password-1" not in stored


def test_the_last_admin_cannot_be_demoted(directory: Directory) -> None:
    directory.create_user("root", "admin", "root-password-12", by="t")
    with pytest.raises(Conflict, match="last enabled admin"):
        directory.update_user("root", role="operator")
    directory.create_user("root2", "admin", "root-password-12", by="t")
    assert directory.update_user("root", role="operator").role.value == "operator"


def test_role_and_user_grants_take_the_best_level(directory: Directory) -> None:
    directory.create_user("op", "operator", "op-password-123", by="t")
    agent = AgentRegistry(directory.store).create("a", owner="someone")
    directory.grant_user(agent.id, "op", level="view", by="t")
    directory.grant_role(agent.id, "operator", level="run", by="t")
    access = directory.actor_for_user("op").agents[agent.id]
    assert access.level.value == "run" and "role operator" in access.source
    directory.grant_user(agent.id, "op", level="edit", by="t")  # replaces the user grant
    assert len(directory.list_grants(agent.id)) == 2


def test_bootstrap_admin_and_cli_token(directory: Directory, tmp_path: Path) -> None:
    generated = ensure_first_admin(directory, {})
    assert generated and directory.check_password("admin", generated)
    assert ensure_first_admin(directory, {}) is None  # only on a fresh installation
    path = tmp_path / "cli-token"
    token = ensure_cli_token(directory, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_cli_token(directory, path) == token
    directory.revoke_token(directory.actor_for_token(token).token_id or "")
    assert ensure_cli_token(directory, path) != token


def test_throttle_per_user_and_per_address(directory: Directory) -> None:
    now = [0.0]
    t = LoginThrottle(directory.store, window=60, per_user=2, per_address=3, clock=lambda: now[0])
    t.failed("a", "10.0.0.1")
    t.failed("a", "10.0.0.1")
    with pytest.raises(Throttled, match="user 'a'"):
        t.check("a", "10.0.0.2")
    t.failed("b", "10.0.0.1")
    with pytest.raises(Throttled, match="client address"):
        t.check("c", "10.0.0.1")
    now[0] = 61
    t.check("a", "10.0.0.1")
