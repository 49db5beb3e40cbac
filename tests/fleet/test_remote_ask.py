"""`egress.default: ask` on a sandbox host on another machine: real processes (a replica on
SQLite, `aamp host serve`), real gVisor, in a network namespace (`remote_ask_probe.py`).

- the run's sandbox is on the remote host; each destination the guest asks for is put to a
  person through the run's approvals, by the replica that drives the run (the host's proxy
  asks over the link), and the answer goes back to the host's proxy: approved reaches the
  upstream, denied does not, unanswered until the approval timeout is denied;
- the host's egress records are in the audit chain, naming the host and the person's
  answer; the run finishes; the audit chain verifies.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("remote_ask_probe.py")


def test_remote_host_puts_ask_destinations_to_the_runs_person(tmp_path: Path, base_image) -> None:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("sandbox hosts need root and runsc here")
    from netns_probe_run import run_probe  # tests/netns_probe_run.py

    report = run_probe(PROBE, tmp_path / "home", [], timeout=900)
    assert report["run"]["status"] == "succeeded", report["run"]
    assert sorted(q["host"] for q in report["questions"]) == sorted(
        ["shop.test", "nope.test", "late.test"]
    ), report["questions"]
    statuses = sorted(d["status"] for d in report["decided"])
    assert statuses == ["approved", "denied", "expired"], report["decided"]
    output = report["tool_output"]
    assert "shop.test 200" in output, output
    assert "nope.test 200" not in output and "late.test 200" not in output, output
    assert report["upstream_saw"] == ["/shop.test"], report["upstream_saw"]
    egress = {e["resource"].split(":")[1]: e for e in report["egress"]}
    assert all(e["host"] == "h1" for e in report["egress"]), report["egress"]
    shop, nope, late = (egress[n] for n in ("shop.test", "nope.test", "late.test"))
    assert shop["decision"] == "allow" and "approved by user:admin" in shop["reason"], shop
    assert nope["decision"] == "deny" and "denied by user:admin" in nope["reason"], nope
    assert late["decision"] == "deny" and "unanswered" in late["reason"], late
    assert report["verify"]["ok"], report["verify"]
