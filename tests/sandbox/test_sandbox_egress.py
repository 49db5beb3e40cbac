"""Egress from inside real sandboxes, through the guest's forwarder and the host's proxy.

With `default: block` and `allow: [a.test]`, a.test works over HTTP and HTTPS (Python urllib,
curl, and chromium in the browser image); b.test gets a refusal naming the rule; a client that
ignores the proxy settings reaches nothing; and every attempt is in the ledger. The host side
runs in a network namespace this test creates, with a.test and b.test as fake hosts on its
loopback: nothing can leave the machine even if the boundary fails open.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("egress_probe.py")
REACH_PROBE = Path(__file__).with_name("reach_probe.py")


def run_probe(settings, *args: str, probe: Path = PROBE) -> dict:
    """Run a probe script under `unshare -n` with this installation's settings; its JSON."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    env = {
        "AAMP_HOME": str(settings.home),
        "AAMP_RUNTIME_DIR": str(settings.runtime_dir),
        "AAMP_IMAGE_DIR": str(settings.image_dir),
    }
    done = subprocess.run(
        ["unshare", "-n", sys.executable, str(probe), json.dumps(env), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_common(report: dict) -> None:
    urllib = report["urllib"]
    assert isinstance(urllib, dict), urllib
    assert urllib["http://a.test/hello"] == {"status": 200, "body": "hello from a.test"}
    assert urllib["https://a.test/hello"] == {"status": 200, "body": "hello from a.test"}
    for url in ("http://b.test/hello", "https://b.test/hello"):
        if url.startswith("http:"):
            assert urllib[url]["status"] == 403, urllib[url]
            assert urllib[url]["rule"] == "default: block"
        else:  # a refused CONNECT surfaces in urllib as a tunnel error carrying the 403
            assert "403" in json.dumps(urllib[url]), urllib[url]
    assert urllib["direct"].startswith("refused"), urllib["direct"]

    curl = report["curl"].splitlines()
    assert curl[0] == "hello from a.test 200", report["curl"]
    assert curl[1] == "403", report["curl"]
    assert "exit=0" not in curl[2], report["curl"]  # --noproxy: nothing answers

    assert report["after_rule_change"] == "403 200", report["after_rule_change"]

    ledger = report["ledger"]
    allowed = {(e["host"], e["port"]) for e in ledger if e["decision"] == "allowed"}
    refused = {(e["host"], e["port"], e["rule"]) for e in ledger if e["decision"] == "refused"}
    assert ("a.test", 80) in allowed and ("a.test", 443) in allowed
    assert ("b.test", 80, "default: block") in refused
    assert ("b.test", 443, "default: block") in refused
    assert all(e["address"] in (None, "127.0.0.10", "127.0.0.11") for e in ledger)


@pytest.mark.usefixtures("base_image")
def test_base_image_egress_follows_the_policy(settings):
    check_common(run_probe(settings, "base"))


@pytest.mark.slow
@pytest.mark.usefixtures("browser_image")
def test_chromium_egress_follows_the_policy(settings):
    report = run_probe(settings, "browser")
    check_common(report)
    lines = report["chromium"].splitlines()
    assert lines[:2] == ["hello from a.test", "403"], report["chromium"]


def test_a_guest_reaches_neither_the_installation_nor_its_own_localhost_through_the_proxy(
    settings, shared_ca_dir, base_image
):
    """A portless rule for a name of this host opens its other ports but never the port the
    installation's API listens on (taken from the settings by the manager); `localhost` in
    the guest is the guest itself; a granted service works without its host in egress.allow,
    and that host on another port stays governed by the rules."""
    report = run_probe(settings, str(shared_ca_dir), probe=REACH_PROBE)
    rows = dict(line.split(": ", 1) for line in report["guest"].strip().splitlines())
    out = {name: row.rsplit(" exit=", 1) for name, row in rows.items()}
    status, headers = out["api"][0].split(":", 1)
    assert status == "403", rows
    assert json.loads(headers)["x-aamp-egress-rule"] == ["installation: own listener"]
    assert out["api-connect"][1] == "56" and "response 403" in out["api-connect"][0], rows
    assert json.loads(out["other"][0]) == {"you_sent": None, "leak": None}
    assert out["localhost"][1] == "7", rows  # nothing listens on the guest's own loopback
    assert json.loads(out["service"][0])["you_sent"].startswith("Bearer ")  # scrubbed
    status, headers = out["service-host-other-port"][0].split(":", 1)
    assert (status, json.loads(headers)["x-aamp-egress-rule"]) == ("403", ["default: block"])
    # The API saw nothing; the others exactly what was allowed.
    assert report["seen"] == ["a.test", "cp.test:8712"]
    refused = sorted(
        (e["host"], e["port"], e["rule"]) for e in report["ledger"] if e["decision"] == "refused"
    )
    assert refused == [
        ("a.test", 80, "default: block"),
        ("cp.test", 8711, "installation: own listener"),
        ("cp.test", 8711, "installation: own listener"),
    ]
    allowed = sorted((e["host"], e["rule"]) for e in report["ledger"] if e["decision"] == "allowed")
    assert allowed == [
        ("a.test", "service: crm"),  # the interception
        ("a.test", "service: crm"),  # the call inside it
        ("cp.test", "allow[0] cp.test"),
    ]
