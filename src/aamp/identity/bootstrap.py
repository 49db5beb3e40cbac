"""First start of an installation: the first admin, and the local CLI's API token.

`aamp up` calls `ensure_first_admin`: if there is no user at all, it creates `admin` with the
password in AAMP_ADMIN_PASSWORD, or a generated one that is returned so the caller prints it
once (it is stored only as its argon2id hash). `ensure_cli_token` keeps a working admin API
token in `$AAMP_HOME/cli-token` (0600), so the CLI on this host works with no login step.
"""

from __future__ import annotations

import os
from pathlib import Path

from aamp.errors import NotFound
from aamp.identity import credentials as cred
from aamp.identity.directory import Directory
from aamp.identity.errors import AuthenticationFailed

ADMIN_PASSWORD_ENV = "AAMP_ADMIN_PASSWORD"
FIRST_ADMIN = "admin"
CLI_TOKEN_NAME = "local cli"


def ensure_first_admin(directory: Directory, env: dict[str, str]) -> str | None:
    """Create the first admin if there are no users; the generated password, if one was made."""
    if directory.list_users():
        return None
    given = env.get(ADMIN_PASSWORD_ENV) or ""
    password = given or cred.generate_password()
    directory.create_user(FIRST_ADMIN, "admin", password, by="system:bootstrap")
    return None if given else password


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _stored_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def ensure_cli_token(directory: Directory, path: Path) -> str:
    """Keep a valid admin token in `path`; replace it if missing, revoked or not an admin's.
    (The CLI reads it there, or takes AAMP_TOKEN instead: `aamp.client.find_token`.)"""
    existing = _stored_token(path)
    if existing:
        try:
            actor = directory.actor_for_token(existing)
            if actor.role is not None and actor.role.value == "admin":
                return existing
        except AuthenticationFailed:
            pass
    admins = [u for u in directory.list_users() if u.role.value == "admin" and not u.disabled]
    if not admins:
        raise NotFound("there is no enabled admin to hold the local CLI token")
    owner = next((u for u in admins if u.username == FIRST_ADMIN), admins[0])
    _, secret = directory.create_token(owner.username, CLI_TOKEN_NAME)
    _write_private(path, secret)
    return secret
