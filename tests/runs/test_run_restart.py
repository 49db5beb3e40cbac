"""kill -9 of the control plane in the middle of a run, then a restart: the run is marked
failed with the reason, no sandbox of it remains (no runsc process, no state directory), and
every step a live client received over SSE is still in the run's step log, unchanged."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
from pathlib import Path

import httpx
import pytest
from run_helpers import free_port, parse_sse, serve_plane
from scripted_model import ScriptedModelServerForTests

from aamp.sandbox import procs


def test_kill_9_mid_run_then_restart(tmp_path: Path, base_image) -> None:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("the control plane needs root and runsc here")
    home, runtime, port = tmp_path / "home", f"/run/aamp-t{secrets.token_hex(4)}", free_port()
    base = f"http://127.0.0.1:{port}"
    turns = [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo started"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 300"}}]},
    ]
    proc = serve_plane(home, runtime, port)
    seen: list[dict] = []
    try:
        with ScriptedModelServerForTests(turns) as model:
            token = (home / "cli-token").read_text().strip()
            h = {"authorization": f"Bearer {token}"}
            with httpx.Client(base_url=base, headers=h, timeout=60) as c:
                made = c.post("/v1/agents", json={"name": "victim"})
                assert made.status_code == 201, made.text
                agent = made.json()["id"]
                assert c.put("/v1/policies/p", json={"name": "p"}).status_code == 200
                llm = {"base_url": model.base_url}
                assert c.put("/v1/model-endpoints/llm", json=llm).status_code == 200
                for kind, name in (("policy", "p"), ("image", "base"), ("model-endpoint", "llm")):
                    c.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": name})
                definition = {
                    "model": {"endpoint": "llm", "name": "scripted"},
                    "tools": ["shell"],
                    "policy": "p",
                }
                assert c.put(f"/v1/agents/{agent}/draft", json=definition).status_code == 200
                assert c.post(f"/v1/agents/{agent}/publish").status_code == 200
                run_id = c.post(f"/v1/agents/{agent}/runs", json={"task": "t"}).json()["id"]
                buffer = ""
                with c.stream("GET", f"/v1/runs/{run_id}/events") as stream:
                    for chunk in stream.iter_text():
                        buffer += chunk
                        seen = parse_sse(buffer.rsplit("\n\n", 1)[0] + "\n\n")
                        calls = [e for e in seen if e["event"] == "tool.call"]
                        if len(calls) == 2:  # the agent is inside `sleep 300`
                            break
                sandbox_id = c.get(f"/v1/runs/{run_id}").json()["sandbox_id"]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            runsc_root = f"--root={runtime}/runsc"
            assert procs.pids_matching(runsc_root, sandbox_id), "the sandbox should be orphaned"
            proc = serve_plane(home, runtime, port)
            with httpx.Client(base_url=base, headers=h, timeout=60) as c:
                run = c.get(f"/v1/runs/{run_id}").json()
                after = parse_sse(c.get(f"/v1/runs/{run_id}/events").text)
                sandboxes = c.get("/v1/sandboxes").json()
    finally:
        proc.kill()
        proc.wait()
        leftover = procs.pids_matching(f"--root={runtime}/runsc")
        shutil.rmtree(runtime, ignore_errors=True)
    assert run["status"] == "failed"
    assert "control plane stopped during the run" in run["reason"]
    assert sandboxes == [] and leftover == []
    # Every streamed step is in the log, unchanged, and the ending follows them.
    assert after[: len(seen)] == seen
    assert after[-1]["event"] == "run.finished" and after[-1]["data"]["status"] == "failed"
    assert [e["id"] for e in after] == list(range(1, len(after) + 1))
    assert json.dumps(after[-1]["data"])
