"""The Must-hold end-to-end run, through the HTTP API with the scripted model and a real gVisor
sandbox, inside a network namespace of its own (see e2e_probe.py): the agent reads an input
file, runs Python that fetches from an allowed loopback upstream through the egress proxy, and
writes an artifact; the run succeeds, the artifact downloads byte-identical, the audit log holds
every step (and the egress decision), and no sandbox remains. The browser variant fills and
submits a form in a local web app and takes a screenshot; a blocked host is an observation."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from run_helpers import parse_sse, probe_in_netns

PROBE = Path(__file__).with_name("e2e_probe.py")


def _probe(tmp_path: Path, mode: str) -> dict:
    return probe_in_netns(PROBE, tmp_path, mode)


def test_end_to_end_run_with_input_python_egress_and_artifact(tmp_path: Path, base_image) -> None:
    report = _probe(tmp_path, "base")
    run = report["run"]
    assert run["status"] == "succeeded", run
    assert run["answer"] == "Wrote out/report.csv"
    assert "north,120" in report["tool_messages"][0]
    assert "rate 1.25 total 250.0" in report["tool_messages"][1]
    assert "out/report.csv" in report["tool_messages"][2]
    assert base64.b64decode(report["artifact_b64"]) == b"total_eur\n250.00\n"
    assert report["artifacts"][0]["sha256"] == report["expected_sha256"]
    assert report["sandboxes_after"] == [] and report["runtime_after"] == []
    events = parse_sse(report["events_text"])
    assert events[-1]["event"] == "run.finished"
    run_audit = [r for r in report["audit"] if r["actor"] == f"run:{run['id']}"]
    audited_steps = [r["details"]["seq"] for r in run_audit if "seq" in r["details"]]
    assert audited_steps == [e["id"] for e in events]
    actions = {r["action"] for r in run_audit}
    assert {"sandbox.create", "sandbox.destroy", "run.artifact", "run.file.in"} <= actions
    egress = [r for r in report["audit"] if r["action"].startswith("egress.")]
    assert any(r["decision"] == "allow" and "data.test" in json.dumps(r) for r in egress)


@pytest.mark.slow
def test_end_to_end_browser_fills_a_form_and_sees_a_blocked_host(
    tmp_path: Path, browser_image
) -> None:
    report = _probe(tmp_path, "browser")
    run = report["run"]
    assert run["status"] == "succeeded", (run, report["tool_messages"])
    messages = report["tool_messages"]
    assert "Expense form" in messages[0] and "http status: 200" in messages[0]
    assert "Thanks: amount=42" in messages[2]
    assert "screenshot taken" in messages[3]
    assert "http status: 403" in messages[4] or "error" in messages[4]
    assert "refused by the egress policy: http://blocked.test/" in messages[4]
    assert "downloaded /workspace/downloads/export.csv (18 bytes, text/csv)" in messages[5]
    assert report["upstream_posts"] == ["amount=42"]
    events = parse_sse(report["events_text"])
    shots = [e["data"] for e in events if e["event"] == "screenshot"]
    assert len(shots) == 1 and base64.b64decode(shots[0]["png_b64"]).startswith(b"\x89PNG")
    # The agent's model takes images: the screenshot was shown to it, once, from then on.
    assert [len(shown) for shown in report["images_shown"]] == [0, 0, 0, 0, 1, 1, 1]
    assert report["images_shown"][4][0].startswith("data:image/png;base64,")
    # The download became an artifact, as the policy's data.outbound allows csv.
    assert report["artifact_files"] == {"downloads/export.csv": "claim,amount\n1,42\n"}
    assert report["sandboxes_after"] == [] and report["runtime_after"] == []


def test_egress_ask_pauses_the_run_until_a_person_answers(tmp_path: Path, base_image) -> None:
    """`egress.default: ask`: the run waits (status waiting_approval) for the admin's answer,
    which comes after both the tool's timeout and the run's wall time would have passed — the
    wait counts against the approval timeout only; the approval is kept for the next call; a
    denial is an observation and the run goes on."""
    report = _probe(tmp_path, "ask")
    run = report["run"]
    assert run["status"] == "succeeded", (run, report["tool_messages"])
    first, second, third = report["tool_messages"]
    assert "needed a person's approval" in first and "approved it" in first
    assert "1.25" in second and "approval" not in second  # approved once, kept for the run
    assert "http 403" in third and "denied by" in third and "not for this task" in third
    seen = report["approvals_seen"]
    assert [(s["kind"], s["subject"]) for s in seen] == [
        ("egress", {"host": "shop.test", "port": 80}),
        ("egress", {"host": "nope.test", "port": 80}),
    ]
    assert all(s["run_status"] == "waiting_approval" for s in seen)
    assert sorted(a["status"] for a in report["approvals"]) == ["approved", "denied"]
    events = parse_sse(report["events_text"])
    kinds = [e["event"] for e in events]
    assert kinds.count("approval.requested") == 2 and kinds.count("approval.decided") == 2
    run_audit = [r["action"] for r in report["audit"] if r["actor"] == f"run:{run['id']}"]
    assert run_audit.count("run.approval.requested") == 2
    egress = [r for r in report["audit"] if r["action"].startswith("egress.")]
    assert any("approved by" in (r["reason"] or "") for r in egress)
    assert report["sandboxes_after"] == [] and report["runtime_after"] == []
