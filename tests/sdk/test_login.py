"""`aamp login|logout|whoami` and `aamp token create --for` against a real `aamp up`: a new
user signs in with the CLI and acts as themselves (their role's refusals, their own audit
records), the token sits in a 0600 profile, several profiles live side by side, and logging
out revokes the token on the control plane."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from aamp import Client, ClientError


def profiles_file(live) -> Path:
    return Path(live.env["XDG_CONFIG_HOME"]) / "aamp" / "profiles.json"


def test_a_new_user_logs_in_with_the_cli_and_acts_as_themselves(live, monkeypatch) -> None:
    made = live.aamp(
        "user", "add", "bea", "--role", "operator", "--password-stdin", input=b"bea-password-one\n"
    )
    assert made.returncode == 0, made.stderr
    assert b"admin (admin)" in live.aamp("whoami").stdout  # the installation's token, before

    wrong = live.aamp("login", "--username", "bea", "--password-stdin", input=b"nope\n")
    assert wrong.returncode == 1 and not profiles_file(live).exists()

    done = live.aamp(
        "login",
        "--url",
        live.url,
        "--username",
        "bea",
        "--password-stdin",
        input=b"bea-password-one\n",
    )
    assert done.returncode == 0, done.stderr
    assert f"logged in to {live.url} as bea (profile default".encode() in done.stdout
    path = profiles_file(live)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    held = json.loads(path.read_text())["profiles"]["default"]
    assert held["username"] == "bea" and held["token"].startswith("aamp_")
    assert "bea-password-one" not in path.read_text()

    # Every later command is bea: her own identity, her role's refusals.
    assert live.aamp("whoami").stdout.decode().startswith("bea (operator)")
    refused = live.aamp("user", "ls")
    assert refused.returncode == 1 and b"admin" in refused.stderr
    created = live.aamp("sandbox", "create")
    assert created.returncode == 1 and b"agent" in created.stderr
    for_other = live.aamp("token", "create", "--for", "admin", "--expires", "30d")
    assert for_other.returncode == 1, for_other.stdout
    with Client(live.url, live.admin_token) as admin:
        page = admin.call("GET", "/v1/audit", params={"actor": "user:bea", "limit": "1000"})
        mine = page["records"]
        assert any(r["action"] == "login" and r["decision"] == "allow" for r in mine)
        assert any(r["action"] == "user.list" and r["decision"] == "deny" for r in mine)
        assert any(r["action"] == "token.create_for" and r["decision"] == "deny" for r in mine)

    # The SDK signs in from the same profile.
    monkeypatch.setenv("XDG_CONFIG_HOME", live.env["XDG_CONFIG_HOME"])
    with Client(profile="default") as client:
        assert client.whoami()["username"] == "bea"

    # A second profile, for the admin's token made for bea by an admin: both kept.
    admin_env = {"AAMP_TOKEN": live.admin_token}
    live.env.update(admin_env)
    try:
        given = live.aamp("token", "create", "--for", "bea", "--expires", "30d", "--name", "ci")
        assert given.returncode == 0, given.stderr
        _, token = given.stdout.decode().split()
    finally:
        del live.env["AAMP_TOKEN"]
    with Client(live.url, token) as as_bea:
        assert as_bea.whoami()["username"] == "bea"
    again = live.aamp(
        "login",
        "--url",
        live.url,
        "--profile",
        "second",
        "--username",
        "bea",
        "--password-stdin",
        input=b"bea-password-one\n",
    )
    assert again.returncode == 0, again.stderr
    assert set(json.loads(path.read_text())["profiles"]) == {"default", "second"}

    # Logging out revokes the token: it no longer signs anything in.
    out = live.aamp("logout", "--profile", "default")
    assert out.returncode == 0, out.stderr
    with Client(live.url, held["token"]) as old, pytest.raises(ClientError) as dead:
        old.whoami()
    assert dead.value.status == 401
    assert set(json.loads(path.read_text())["profiles"]) == {"second"}
    # `second`, the latest login, is the default; AAMP_PROFILE names one that is gone.
    assert live.aamp("whoami").stdout.startswith(b"bea (operator)")
    live.env["AAMP_PROFILE"] = "default"
    try:
        named = live.aamp("whoami")
        assert named.returncode == 1 and b"no profile 'default'" in named.stderr
    finally:
        del live.env["AAMP_PROFILE"]
    assert live.aamp("logout").returncode == 0
    assert json.loads(path.read_text()) == {"default": None, "profiles": {}}
    assert live.aamp("whoami").stdout.startswith(b"admin (admin)")  # the installation's again
    assert live.aamp("logout").returncode == 1


def test_a_profiles_file_others_can_read_is_refused(live) -> None:
    path = profiles_file(live)
    path.parent.mkdir(parents=True)
    path.write_text(
        '{"default": "x", "profiles": {"x": {"url": "http://127.0.0.1:1", "token": "t"}}}'
    )
    path.chmod(0o644)
    out = live.aamp("whoami")
    assert (
        out.returncode == 1 and b"readable by others" in out.stderr and b"chmod 600" in out.stderr
    )


def test_a_client_takes_a_url_and_token_or_a_profile_not_both() -> None:
    with pytest.raises(ClientError, match="not both"):
        Client("http://127.0.0.1:1", "t", profile="default")
    with pytest.raises(ClientError, match="both the url and the token, or neither"):
        Client("http://127.0.0.1:1")
