"""`aamp agent create|edit|publish|ls` and `aamp run ...` against a real `aamp up`, with the
scripted model double: the run's steps stream in the terminal, artifacts download."""

from __future__ import annotations

import re
import time

import pytest
from scripted_model import ScriptedModelServerForTests
from test_cli import ControlPlane  # tests/api/test_cli.py: a real `aamp up` process

pytestmark = pytest.mark.usefixtures("base_image")

AGENT = """
name: reporter
model: {endpoint: llm, name: scripted}
system_prompt: You write reports.
tools: [python, files]
policy: files-only
limits: {max_steps: 5, wall_time: 2m}
"""

POLICY = """
name: files-only
image: base
data:
  inbound: {max_bytes: 1MB, types: [csv]}
  outbound: {max_bytes: 1MB, types: [txt]}
"""

WRITE = "open('/workspace/out/n.txt','w').write(str(len(open('/workspace/in/a.csv').read())))"


def test_agent_and_run_commands(settings, tmp_path) -> None:
    turns = [
        {"tool_calls": [{"name": "python", "arguments": {"code": WRITE}}]},
        {"content": "Counted."},
    ]
    plane = ControlPlane(settings)
    plane.start()
    try:
        with ScriptedModelServerForTests(turns) as model:
            agent_file = tmp_path / "agent.yaml"
            agent_file.write_text(AGENT)
            (tmp_path / "policy.yaml").write_text(POLICY)
            (tmp_path / "a.csv").write_bytes(b"x,y\n1,2\n")
            bad = tmp_path / "bad.yaml"
            bad.write_text("name: broken\nmodel: {name: m}\npolicy: files-only\n")
            out = plane.aamp("agent", "create", "-f", str(bad))
            assert out.returncode != 0 and b"model.endpoint: required" in out.stderr
            inline = f"name: inline\nmodel: {{base_url: '{model.base_url}', name: m}}\n"
            bad.write_text(inline + "policy: files-only\n")
            out = plane.aamp("agent", "create", "-f", str(bad))
            assert out.returncode != 0 and b"model.base_url: an agent does not carry" in out.stderr
            listed = plane.aamp("agent", "ls").stdout
            assert b"broken" not in listed and b"inline" not in listed  # nothing half-made
            out = plane.aamp(
                "model-endpoint", "put", "llm", "--base-url", model.base_url, "--models", "scripted"
            )
            assert out.returncode == 0, out.stderr
            assert b"llm http://127.0.0.1:" in out.stdout and b"(loopback)" in out.stdout
            assert b"llm " in plane.aamp("model-endpoint", "ls").stdout
            out = plane.aamp("agent", "create", "-f", str(agent_file))
            assert out.returncode == 0, out.stderr
            assert b"draft version 1" in out.stdout
            assert plane.aamp("policy", "put", str(tmp_path / "policy.yaml")).returncode == 0
            for kind, name in (
                ("policy", "files-only"),
                ("image", "base"),
                ("model-endpoint", "llm"),
            ):
                done = plane.aamp("grant", "attach", "reporter", kind, name)
                assert done.returncode == 0, done.stderr
            out = plane.aamp("run", "reporter", "count", "--input", str(tmp_path / "a.csv"))
            assert out.returncode != 0 and b"no published version" in out.stderr
            assert plane.aamp("agent", "publish", "reporter").returncode == 0
            listed = plane.aamp("agent", "ls").stdout.decode()
            assert re.search(r"reporter\s+admin\s+1\b", listed), listed
            out = plane.aamp("run", "reporter", "count", "--input", str(tmp_path / "a.csv"))
            text = out.stdout.decode()
            assert out.returncode == 0, (text, out.stderr)
            assert "model: python" in text and "→ python" in text and "← ok" in text
            assert "artifact n.txt (1 bytes" in text and "run succeeded" in text
            run_id = re.search(r"run (run-[0-9a-f]+)", text).group(1)
            assert run_id in plane.aamp("run", "ls").stdout.decode()
            assert b'"status": "succeeded"' in plane.aamp("run", "show", run_id).stdout
            dest = tmp_path / "dl"
            out = plane.aamp("run", "artifacts", run_id, "--download", str(dest))
            assert out.returncode == 0 and (dest / "n.txt").read_bytes() == b"8"
            out = plane.aamp("run", "cancel", run_id)
            assert out.returncode != 0 and b"already ended" in out.stderr
    finally:
        plane.stop()


def test_approval_commands_answer_a_waiting_run(settings, tmp_path) -> None:
    turns = [
        {"tool_calls": [{"name": "python", "arguments": {"code": WRITE}}]},
        {"content": "Counted."},
    ]
    policy = POLICY.replace("files-only", "files-ask").replace("[txt]}", "[txt], approval: true}")
    plane = ControlPlane(settings)
    plane.start()
    try:
        with ScriptedModelServerForTests(turns) as model:
            agent = AGENT.replace("files-only", "files-ask")
            (tmp_path / "agent.yaml").write_text(agent.replace("name: reporter", "name: asker"))
            (tmp_path / "policy.yaml").write_text(policy)
            (tmp_path / "a.csv").write_bytes(b"x,y\n1,2\n")
            for command in (
                ("agent", "create", "-f", str(tmp_path / "agent.yaml")),
                ("policy", "put", str(tmp_path / "policy.yaml")),
                ("model-endpoint", "put", "llm", "--base-url", model.base_url),
                ("grant", "attach", "asker", "policy", "files-ask"),
                ("grant", "attach", "asker", "image", "base"),
                ("grant", "attach", "asker", "model-endpoint", "llm"),
                ("agent", "publish", "asker"),
            ):
                done = plane.aamp(*command)
                assert done.returncode == 0, (command, done.stderr)
            out = plane.aamp(
                "run", "asker", "count", "--input", str(tmp_path / "a.csv"), "--no-follow"
            )
            run_id = re.search(r"run (run-[0-9a-f]+)", out.stdout.decode()).group(1)
            listed = ""
            for _ in range(300):
                listed = plane.aamp("approval", "ls").stdout.decode()
                if run_id in listed:
                    break
                time.sleep(0.2)
            row = next(line for line in listed.splitlines() if run_id in line)
            assert "data.outbound" in row and "n.txt (1 bytes)" in row and "pending" in row
            approval_id = row.split()[0]
            out = plane.aamp("approval", "approve", approval_id, "--note", "fine")
            assert out.returncode == 0, out.stderr
            assert f"approval {approval_id} approved (run {run_id})" in out.stdout.decode()
            again = plane.aamp("approval", "deny", approval_id)
            assert again.returncode != 0 and b"already answered" in again.stderr
            for _ in range(300):
                shown = plane.aamp("run", "show", run_id).stdout.decode()
                if '"status": "succeeded"' in shown:
                    break
                time.sleep(0.2)
            assert '"status": "succeeded"' in shown
            history = plane.aamp("approval", "ls", "--all").stdout.decode()
            assert re.search(rf"{approval_id}.*approved\s+user:admin", history), history
    finally:
        plane.stop()
