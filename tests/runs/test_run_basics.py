"""Runs through the HTTP API with a real gVisor sandbox and the scripted model double:
inputs in, Python in the sandbox, invalid tool calls refused before the sandbox, artifacts out
byte-identical and audited, every step stored, streamed and audited, the sandbox gone."""

from __future__ import annotations

import base64
import hashlib
import json

from run_helpers import make_agent, parse_sse, wait_end
from scripted_model import ScriptedModelServerForTests
from sqlalchemy import text

from aamp.api.runs import service_of

POLICY = {
    "name": "csv-work",
    "image": "base",
    "data": {
        "inbound": {"max_bytes": "1MB", "types": ["csv"]},
        "outbound": {"max_bytes": "1MB", "types": ["csv", "txt"]},
    },
    "lifetime": {"ttl": "10m", "idle": "5m"},
}

COMPUTE = """
import csv
rows = list(csv.DictReader(open('/workspace/in/sales.csv')))
total = sum(int(r['amount']) for r in rows)
open('/workspace/out/total.csv', 'w').write(f'total\\n{total}\\n')
print('total', total)
"""


async def test_a_run_reads_input_runs_python_and_leaves_an_artifact(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    csv_bytes = b"region,amount\nnorth,120\nsouth,80\neast,42\n"
    turns = [
        {
            "tool_calls": [
                {"name": "files", "arguments": {"action": "read", "path": "in/sales.csv"}}
            ]
        },
        {"tool_calls": [{"name": "python", "arguments": {"code": 7}}]},  # invalid: not a string
        {"tool_calls": [{"name": "shell", "arguments": "{not json"}]},
        {"tool_calls": [{"name": "python", "arguments": {"code": COMPUTE}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "yes aamp | head -c 50000"}}]},
        {"content": "The total is 242."},
    ]
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(
                admin, "summer", model.base_url, POLICY, limits={"observation_bytes": 2000}
            )
            made = await admin.post(
                f"/v1/agents/{agent}/runs",
                json={
                    "task": "Sum the amounts in sales.csv into out/total.csv",
                    "inputs": [
                        {"name": "sales.csv", "content_b64": base64.b64encode(csv_bytes).decode()}
                    ],
                },
            )
            assert made.status_code == 201, made.text
            run_id = made.json()["id"]
            run = await wait_end(admin, run_id)
            assert run["status"] == "succeeded", run
            assert run["answer"] == "The total is 242."
            assert run["steps"] == 6 and run["prompt_tokens"] > 0
            arts = (await admin.get(f"/v1/runs/{run_id}/artifacts")).json()
            assert [a["name"] for a in arts] == ["total.csv"]
            got = await admin.get(f"/v1/runs/{run_id}/artifacts/total.csv")
            assert got.status_code == 200
            assert got.content == b"total\n242\n"
            assert arts[0]["sha256"] == hashlib.sha256(got.content).hexdigest()
            sse = await admin.get(f"/v1/runs/{run_id}/events")
            events = parse_sse(sse.text)
            resumed = parse_sse(
                (await admin.get(f"/v1/runs/{run_id}/events", headers={"last-event-id": "5"})).text
            )
    # The model saw the file's content, then the two refusals, then the Python output.
    tool_msgs = [m for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert "north,120" in tool_msgs[0]["content"]
    assert "invalid arguments for python" in tool_msgs[1]["content"]
    assert "not valid JSON" in tool_msgs[2]["content"]
    assert "total 242" in tool_msgs[3]["content"]
    assert "bytes truncated by aamp" in tool_msgs[4]["content"]
    assert len(tool_msgs[4]["content"].encode()) < 2200
    types = [e["event"] for e in events]
    assert types[0] == "run.queued" and types[-1] == "run.finished"
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert types.count("model.call") == 6 and types.count("tool.result") == 5
    invalid = [e["data"] for e in events if e["event"] == "tool.result"][1]
    assert invalid["ok"] is False and invalid["detail"] == {"invalid": True}
    assert [e["id"] for e in resumed] == list(range(6, len(events) + 1))
    # Reading a finished run's steps leaves nothing waiting for steps that cannot come.
    assert run_id not in service_of(cp).bus._waiters
    # Nothing of the sandbox remains.
    assert cp.manager.list() == []
    assert list((cp.settings.runtime_dir / "sb").iterdir()) == []
    # Every step is in the audit log, in order, with the artifact's hash.
    with cp.store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT action, details FROM audit_records WHERE actor = :a ORDER BY seq"),
            {"a": f"run:{run_id}"},
        ).all()
    step_records = [json.loads(d)["seq"] for a, d in rows if a.startswith("run.") and "seq" in d]
    assert step_records == list(range(1, len(events) + 1))
    actions = [a for a, _ in rows]
    assert "sandbox.create" in actions and "sandbox.destroy" in actions
    artifact = [json.loads(d) for a, d in rows if a == "run.artifact"]
    assert artifact[0]["sha256"] == hashlib.sha256(b"total\n242\n").hexdigest()
