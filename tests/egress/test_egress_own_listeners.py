"""The installation's own listeners are never reached, whatever the rules say (egress_own,
run inside a network namespace this test creates), and how "this host" is recognised."""

from __future__ import annotations

import ipaddress
import json
import os

import pytest
from egress_own import ATTEMPTS, NETNS_ADDRESSES

from aamp.config import Settings
from aamp.egress.installation import (
    InstallationListeners,
    Listener,
    announce,
    is_local,
    listeners_dir,
)

REFUSED = [*ATTEMPTS, "service-whose-upstream-is-the-api"]


@pytest.fixture(scope="module")
def outcome(netns):
    return netns("egress_own:run", {}, NETNS_ADDRESSES)


@pytest.mark.parametrize("name", REFUSED)
def test_the_installation_is_refused_whatever_the_rules_say(outcome, name):
    result = outcome[name]
    assert (result["status"], result["rule"]) == (403, "installation: own listener"), result
    assert result["hits"] == {}  # no fake installation server saw a connection
    [event] = result["events"]
    assert (event["decision"], event["rule"], event["bytes_up"]) == (
        "refused",
        "installation: own listener",
        0,
    )
    assert "never connects to what the installation itself serves" in event["reason"]
    assert "rule: installation: own listener" in result["body"]


def test_the_refusal_names_what_is_there(outcome):
    assert "the control plane's API (127.0.0.1:8700)" in outcome["api-by-name"]["body"]
    assert (
        "a wildcard listener (0.0.0.0:9100)"
        in outcome["wildcard-listener-via-local-address"]["body"]
    )
    assert "the local model server" in outcome["announced-model-server"]["body"]
    assert outcome["api-via-unspecified-address"]["events"][0]["address"] == "0.0.0.0"
    assert outcome["secrets-read"]["names"] == []


@pytest.mark.parametrize(
    ("name", "server"),
    [
        ("other-port-by-name", "plain"),
        ("other-port-via-local-address", "plain"),
        ("model-after-its-announcement-ended", "model"),
    ],
)
def test_the_same_rules_reach_other_ports_of_this_host(outcome, name, server):
    """Positive controls: the portless rules do open other ports (as documented), so the
    refusals above are the installation check's doing, not a missing listener."""
    result = outcome[name]
    assert result["status"] == 200, result
    assert result["hits"] == {server: 1}
    assert [e["decision"] for e in result["events"]] == ["allowed"]


def test_is_local_knows_this_host():
    for text in ("127.0.0.1", "127.9.9.9", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1"):
        assert is_local(ipaddress.ip_address(text)), text
    for text in ("192.0.2.1", "2001:db8::1", "::ffff:192.0.2.1"):
        assert not is_local(ipaddress.ip_address(text)), text


def test_listeners_come_from_settings_and_announcements(tmp_path):
    settings = Settings(
        home=tmp_path, runtime_dir=tmp_path / "rt", image_dir=tmp_path / "img", listen_port=8765
    )
    listeners = InstallationListeners.of(settings)
    assert listeners.all() == (Listener("the control plane's API", "127.0.0.1", 8765),)
    assert listeners.serving(ipaddress.ip_address("127.0.0.1"), 8765) is not None
    assert listeners.serving(ipaddress.ip_address("127.0.0.1"), 8766) is None
    directory = listeners_dir(tmp_path)
    model = Listener("the local model server", "127.0.0.1", 8080)
    with announce(directory, model) as path:
        assert path.parent == directory and oct(directory.stat().st_mode & 0o777) == "0o700"
        assert listeners.serving(ipaddress.ip_address("127.0.0.1"), 8080) == model
        # An unreadable file and one left by a dead process are ignored.
        (directory / "junk.json").write_text("{not json")
        (directory / "999999999-9.json").write_text(
            json.dumps({"what": "x", "host": "127.0.0.1", "port": 9, "pid": 999999999})
        )
        os.utime(directory, ns=(0, 0))  # force a re-read
        assert listeners.serving(ipaddress.ip_address("127.0.0.1"), 9) is None
        assert listeners.serving(ipaddress.ip_address("127.0.0.1"), 8080) == model
    os.utime(directory, ns=(1, 1))
    assert listeners.serving(ipaddress.ip_address("127.0.0.1"), 8080) is None


def test_announcing_removes_what_killed_processes_left(tmp_path):
    directory = listeners_dir(tmp_path)
    directory.mkdir()
    dead = directory / "999999999-9.json"
    dead.write_text(json.dumps({"what": "x", "host": "127.0.0.1", "port": 9, "pid": 999999999}))
    with announce(directory, Listener("the local model server", "127.0.0.1", 8080)) as mine:
        assert sorted(directory.iterdir()) == [mine]
    assert list(directory.iterdir()) == []


def test_the_local_model_server_is_announced_while_it_serves(tmp_path, monkeypatch):
    """`aamp model serve` (here through `LocalModelServer`, which runs it) is one of the
    installation's own listeners from the moment it answers until it stops."""
    from aamp.agents.local_model import LocalModelServer, missing_parts

    if missing_parts():
        pytest.skip(f"the local model server is not installed: {', '.join(missing_parts())}")
    monkeypatch.setenv("AAMP_HOME", str(tmp_path))
    settings = Settings.from_env()
    listeners = InstallationListeners.of(settings)
    server = LocalModelServer(n_ctx=512, n_threads=1).start()
    try:
        found = listeners.serving(ipaddress.ip_address("127.0.0.1"), server.port)
        assert found is not None and found.what.startswith("the local model server")
    finally:
        server.stop()
    assert list(listeners_dir(tmp_path).iterdir()) == []  # removed on the way out
    os.utime(listeners_dir(tmp_path), ns=(1, 1))
    assert listeners.serving(ipaddress.ip_address("127.0.0.1"), server.port) is None
