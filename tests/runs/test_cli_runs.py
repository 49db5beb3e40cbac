"""`aamp agent create|edit|publish|ls` and `aamp run ...` against a real `aamp up`, with the
scripted model double: the run's steps stream in the terminal, artifacts download."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pytest
from scripted_model import ScriptedModelServerForTests
from test_cli import ControlPlane  # tests/api/test_cli.py: a real `aamp up` process

from aamp.runs.run_files import artifacts_dir
from aamp.runs.store import RunStore
from aamp.store import Store

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


def write_reporter(tmp_path) -> Path:
    """agent.yaml and policy.yaml for the `reporter` agent, and its input; returns the CSV."""
    (tmp_path / "agent.yaml").write_text(AGENT)
    (tmp_path / "policy.yaml").write_text(POLICY)
    csv = tmp_path / "a.csv"
    csv.write_bytes(b"x,y\n1,2\n")
    return csv


def publish_agent(plane, tmp_path, agent: str, policy: str, model_url: str) -> None:
    """Create the agent and its policy from tmp_path's files, register the model endpoint
    `llm` at `model_url`, grant them all, publish."""
    for command in (
        ("agent", "create", "-f", str(tmp_path / "agent.yaml")),
        ("policy", "put", str(tmp_path / "policy.yaml")),
        ("model-endpoint", "put", "llm", "--base-url", model_url),
        ("grant", "attach", agent, "policy", policy),
        ("grant", "attach", agent, "image", "base"),
        ("grant", "attach", agent, "model-endpoint", "llm"),
        ("agent", "publish", agent),
    ):
        done = plane.aamp(*command)
        assert done.returncode == 0, (command, done.stderr)


def test_agent_and_run_commands(settings, tmp_path) -> None:
    turns = [
        {"tool_calls": [{"name": "python", "arguments": {"code": WRITE}}]},
        {"content": "Counted."},
    ]
    plane = ControlPlane(settings)
    plane.start()
    try:
        with ScriptedModelServerForTests(turns) as model:
            write_reporter(tmp_path)
            agent_file = tmp_path / "agent.yaml"
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
            publish_agent(plane, tmp_path, "asker", "files-ask", model.base_url)
            out = plane.aamp(
                "run", "asker", "count", "--input", str(tmp_path / "a.csv"), "--no-follow"
            )
            assert out.returncode == 0, out.stderr
            assert re.fullmatch(r"run-[0-9a-f]+\n", out.stdout.decode()), out.stdout  # only the id
            run_id = out.stdout.decode().strip()
            listed = ""
            for _ in range(300):
                listed = plane.aamp("approval", "ls").stdout.decode()
                if run_id in listed:
                    break
                time.sleep(0.2)
            row = next(line for line in listed.splitlines() if run_id in line)
            assert "data.outbound" in row and "n.txt (1 bytes)" in row and "pending" in row
            approval_id = row.split()[0]
            # --run lists that run's questions only.
            assert approval_id in plane.aamp("approval", "ls", "--run", run_id).stdout.decode()
            other = plane.aamp("approval", "ls", "--all", "--run", "run-000000000000")
            assert other.returncode == 0 and approval_id not in other.stdout.decode()
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


WRITE_TWO = (
    "import os; os.makedirs('/workspace/out/sub', exist_ok=True); "
    "open('/workspace/out/n.txt','w').write('8'); "
    "open('/workspace/out/sub/n.txt','w').write('in sub')"
)


def test_run_download_saves_checked_artifacts_when_the_run_ends(settings, tmp_path) -> None:
    turns = [
        {"tool_calls": [{"name": "python", "arguments": {"code": WRITE_TWO}}]},
        {"content": "Written."},
        {"status": 400},  # the second run's model refuses: that run fails
    ]
    plane = ControlPlane(settings)
    plane.start()
    try:
        with ScriptedModelServerForTests(turns) as model:
            csv = write_reporter(tmp_path)
            publish_agent(plane, tmp_path, "reporter", "files-only", model.base_url)
            start = ("run", "reporter", "count", "--input", str(csv))

            # Refused before any run starts: nothing to wait for, or nowhere to save.
            dest = tmp_path / "dl"
            out = plane.aamp(*start, "--download", str(dest), "--no-follow")
            assert out.returncode == 1 and b"cannot go with --no-follow" in out.stderr
            a_file = tmp_path / "a-file"
            a_file.write_bytes(b"")
            out = plane.aamp(*start, "--download", str(a_file))
            assert out.returncode == 1 and b"exists and is not a directory" in out.stderr
            assert b"run-" not in plane.aamp("run", "ls").stdout

            out = plane.aamp(*start, "--download", str(dest))
            text, progress = out.stdout.decode(), out.stderr.decode()
            assert out.returncode == 0, (text, progress)
            assert "run succeeded" in text
            run_id = re.search(r"run (run-[0-9a-f]+)", text).group(1)
            # Each artifact keeps its path under /workspace/out: the two n.txt stay apart.
            assert (dest / "n.txt").read_bytes() == b"8"
            assert (dest / "sub" / "n.txt").read_bytes() == b"in sub"
            assert f"downloading 2 artifact(s) of run {run_id} into {dest}" in progress
            assert "[1/2] n.txt (1 bytes)" in progress and "[2/2] sub/n.txt (6 bytes)" in progress
            assert f"[2/2] saved {dest / 'sub' / 'n.txt'}" in progress
            assert sorted(p.name for p in dest.rglob("*")) == ["n.txt", "n.txt", "sub"]

            # Again into the same directory: the same bytes are kept, other bytes never replaced.
            again = plane.aamp("run", "artifacts", run_id, "--download", str(dest))
            assert again.returncode == 0 and b"is already there" in again.stderr
            (dest / "n.txt").write_bytes(b"mine")
            clash = plane.aamp("run", "artifacts", run_id, "--download", str(dest))
            assert clash.returncode == 1
            assert b"already exists with other content; not overwritten" in clash.stderr
            assert (dest / "n.txt").read_bytes() == b"mine"

            # A symbolic link inside the directory is not followed out of it.
            outside, linked = tmp_path / "outside", tmp_path / "linked"
            outside.mkdir()
            linked.mkdir()
            (linked / "sub").symlink_to(outside)
            out = plane.aamp("run", "artifacts", run_id, "--download", str(linked))
            assert out.returncode == 1 and b"is a symbolic link; not followed" in out.stderr
            assert list(outside.iterdir()) == [] and not (linked / "n.txt").exists()

            # An option that does not apply is refused, not ignored.
            out = plane.aamp("run", "show", run_id, "--download", str(dest))
            assert out.returncode == 1 and b"--download does not apply" in out.stderr

            # A run that fails exits non-zero; it left nothing to download.
            failed_dest = tmp_path / "failed"
            out = plane.aamp(*start, "--download", str(failed_dest))
            assert out.returncode == 1 and b"run failed" in out.stdout, out.stdout
            assert b"has no artifacts to download" in out.stderr
            assert not failed_dest.exists()

            # From the untrusted side: bytes that are not what the run recorded, and a name
            # that climbs out (written by someone with the server's disk and database).
            stored = artifacts_dir(plane.settings, run_id) / hashlib.sha256(b"8").hexdigest()
            for forged, words in ((b"9", b"received 1 bytes, sha256 "), (b"8888", b"more than")):
                stored.write_bytes(forged)
                bad = tmp_path / f"forged-{len(forged)}"
                out = plane.aamp("run", "artifacts", run_id, "--download", str(bad))
                assert out.returncode == 1 and words in out.stderr, out.stderr
                assert b"the run recorded; not saved" in out.stderr
                assert not (bad / "n.txt").exists()
                assert [p.name for p in bad.rglob("*")] == []  # no partial file either
            stored.write_bytes(b"8")
            with Store.open(plane.settings) as store:
                RunStore(store).add_artifact(
                    run_id, "../escape.txt", 1, hashlib.sha256(b"8").hexdigest()
                )
            climbing = tmp_path / "climbing" / "dl"
            out = plane.aamp("run", "artifacts", run_id, "--download", str(climbing))
            assert out.returncode == 1, out.stderr
            assert b"'../escape.txt': would leave the download directory" in out.stderr
            assert not (tmp_path / "climbing" / "escape.txt").exists()
            assert not climbing.exists()  # refused before anything was written
    finally:
        plane.stop()
