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


def run_probe(settings, image: str) -> dict:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    env = {
        "AAMP_HOME": str(settings.home),
        "AAMP_RUNTIME_DIR": str(settings.runtime_dir),
        "AAMP_IMAGE_DIR": str(settings.image_dir),
    }
    done = subprocess.run(
        ["unshare", "-n", sys.executable, str(PROBE), json.dumps(env), image],
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
