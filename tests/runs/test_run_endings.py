"""How runs end: a blocked domain is an observation and the run still ends cleanly; max steps
and wall time end the run as such; cancel works mid-step; model errors are retried, then fail
the run with the reason; outbound data waiting for approval resumes or fails on the answer.
In every case the sandbox is gone afterwards."""

from __future__ import annotations

import asyncio

from run_helpers import make_agent, parse_sse, wait_end
from scripted_model import ScriptedModelServerForTests

from aamp.runs.run_files import artifacts_dir

POLICY = {
    "name": "closed",
    "image": "base",
    "egress": {"default": "block"},
    "data": {"outbound": {"max_bytes": "1MB", "types": ["txt"]}},
}

FETCH_BLOCKED = """
import urllib.request, urllib.error
try:
    urllib.request.urlopen('http://blocked.example/data', timeout=20)
except urllib.error.HTTPError as e:
    print('refused', e.code, e.headers.get('X-Aamp-Egress-Rule'))
"""


def _no_sandbox(cp) -> None:
    assert cp.manager.list() == []
    assert list((cp.settings.runtime_dir / "sb").iterdir()) == []


async def _start(client, agent: str, task: str = "do it") -> str:
    made = await client.post(f"/v1/agents/{agent}/runs", json={"task": task})
    assert made.status_code == 201, made.text
    return made.json()["id"]


async def test_a_blocked_domain_is_an_observation_and_the_run_ends_cleanly(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    turns = [
        {"tool_calls": [{"name": "python", "arguments": {"code": FETCH_BLOCKED}}]},
        {"content": "I cannot reach blocked.example: the policy blocks it."},
    ]
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(admin, "blocked", model.base_url, POLICY)
            run = await wait_end(admin, await _start(admin, agent))
    assert run["status"] == "succeeded", run
    observation = model.requests[1]["messages"][-1]["content"]
    assert "refused 403 default: block" in observation
    _no_sandbox(cp)


async def test_max_steps_ends_the_run_as_such(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": "true"}}]}] * 5
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(
                admin, "looper", model.base_url, POLICY, limits={"max_steps": 3}
            )
            run = await wait_end(admin, await _start(admin, agent))
    assert run["status"] == "failed"
    assert run["reason"].startswith("max_steps") and run["steps"] == 3
    assert len(model.requests) == 3
    _no_sandbox(cp)


async def test_wall_time_ends_the_run_as_timed_out(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 30"}}]}]
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(
                admin, "slow", model.base_url, POLICY, limits={"wall_time": "3s"}
            )
            run = await wait_end(admin, await _start(admin, agent), timeout=60)
    assert run["status"] == "timed_out", run
    assert run["reason"].startswith("wall_time")
    _no_sandbox(cp)


async def test_cancel_mid_step_destroys_the_sandbox(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60"}}]}]
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(admin, "cancelme", model.base_url, POLICY)
            run_id = await _start(admin, agent)
            for _ in range(300):
                run = (await admin.get(f"/v1/runs/{run_id}")).json()
                if run["steps"] >= 1:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # inside `sleep 60` now
            cancelled = await admin.post(f"/v1/runs/{run_id}/cancel")
            assert cancelled.status_code == 200, cancelled.text
            assert cancelled.json()["status"] == "cancelled"
            assert "cancelled by user:admin" in cancelled.json()["reason"]
            again = await admin.post(f"/v1/runs/{run_id}/cancel")
            assert again.status_code == 409
            events = parse_sse((await admin.get(f"/v1/runs/{run_id}/events")).text)
    assert events[-1]["event"] == "run.finished"
    assert events[-1]["data"]["status"] == "cancelled"
    _no_sandbox(cp)


async def test_model_errors_are_retried_then_fail_the_run_with_the_reason(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    turns = [{"status": 500}, {"content": "recovered"}]
    with ScriptedModelServerForTests(turns) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(admin, "flaky", model.base_url, POLICY)
            run = await wait_end(admin, await _start(admin, agent))
            assert run["status"] == "succeeded" and run["answer"] == "recovered"
            events = parse_sse((await admin.get(f"/v1/runs/{run['id']}/events")).text)
    assert [e["data"]["attempts"] for e in events if e["event"] == "model.call"] == [2]
    failing = [{"status": 503}] * 3
    with ScriptedModelServerForTests(failing) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(admin, "down", model.base_url, {**POLICY, "name": "closed2"})
            run = await wait_end(admin, await _start(admin, agent))
    assert run["status"] == "failed"
    assert "failed 3 times" in run["reason"] and "HTTP 503" in run["reason"]
    _no_sandbox(cp)


async def _approval_run(plane, model, name: str, answer: str | None, timeout: str = "2m"):
    policy = {
        **POLICY,
        "name": f"ask-{name}",
        "data": {"outbound": {"max_bytes": "1MB", "types": ["txt"], "approval": True}},
    }
    op = await plane.user(f"op-{name}", "operator")
    other_op = await plane.user(f"op2-{name}", "operator")
    editor = await plane.user(f"ed-{name}", "builder")
    async with plane.client(plane.admin_token) as admin:
        agent = await make_agent(
            admin, name, model.base_url, policy, limits={"approval_timeout": timeout}
        )
        grants = ((f"op-{name}", "run"), (f"op2-{name}", "run"), (f"ed-{name}", "edit"))
        for user, level in grants:
            r = await admin.post(f"/v1/agents/{agent}/grants", json={"user": user, "level": level})
            assert r.status_code == 201
    async with (
        plane.client(op) as c_op,
        plane.client(other_op) as c_other,
        plane.client(editor) as c_ed,
    ):
        run_id = await _start(c_op, agent)
        for _ in range(600):
            # Status first: the question is stored in the same transaction that sets
            # waiting_approval, so a status past "running" means the list below holds it.
            status = (await c_op.get(f"/v1/runs/{run_id}")).json()["status"]
            pending = (await c_ed.get("/v1/approvals")).json()
            if pending or status not in ("queued", "running"):
                break
            await asyncio.sleep(0.1)
        run = (await c_op.get(f"/v1/runs/{run_id}")).json()
        # The run's owner sees its question (and may answer it: the web UI's live view);
        # another operator with `run` on the same agent sees neither the run nor the question.
        owner_sees = (await c_op.get("/v1/approvals")).json()
        other_sees = (await c_other.get("/v1/approvals")).json()
        result = None
        if answer is not None:
            assert run["status"] == "waiting_approval", run
            assert pending[0]["subject"]["name"] == "report.txt"
            assert [a["id"] for a in owner_sees] == [pending[0]["id"]]
            refused = await c_other.post(
                f"/v1/approvals/{pending[0]['id']}", json={"decision": answer}
            )
            assert refused.status_code == 403
            result = await c_ed.post(f"/v1/approvals/{pending[0]['id']}", json={"decision": answer})
            assert result.status_code == 200, result.text
        run = await wait_end(c_op, run_id)
        arts = (await c_op.get(f"/v1/runs/{run_id}/artifacts")).json()
    assert other_sees == []
    return run, arts


WRITE = {"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi > out/report.txt"}}]}


async def test_outbound_data_waits_for_approval_and_resumes(run_plane) -> None:
    with ScriptedModelServerForTests([WRITE, {"content": "done"}]) as model:
        run, arts = await _approval_run(run_plane, model, "approved", "approve")
    assert run["status"] == "succeeded" and [a["name"] for a in arts] == ["report.txt"]
    _no_sandbox(run_plane.cp)


async def test_a_denied_approval_fails_the_run(run_plane) -> None:
    with ScriptedModelServerForTests([WRITE, {"content": "done"}]) as model:
        run, arts = await _approval_run(run_plane, model, "denied", "deny")
    assert run["status"] == "failed" and "user:ed-denied denied approval" in run["reason"]
    assert arts == []
    kept = artifacts_dir(run_plane.cp.settings, run["id"])
    assert not kept.exists() or list(kept.iterdir()) == []  # denied data is not kept
    _no_sandbox(run_plane.cp)


async def test_an_unanswered_approval_times_out_separately(run_plane) -> None:
    with ScriptedModelServerForTests([WRITE, {"content": "done"}]) as model:
        run, _ = await _approval_run(run_plane, model, "silent", None, timeout="2s")
    assert run["status"] == "failed" and run["reason"].startswith("approval_timeout")
    kept = artifacts_dir(run_plane.cp.settings, run["id"])
    assert not kept.exists() or list(kept.iterdir()) == []
    _no_sandbox(run_plane.cp)


async def test_outbound_approval_above_a_size_asks_only_past_it(run_plane) -> None:
    """`approval: 10B`: the small file leaves freely; the one that brings the run's output past
    10 bytes waits for a person."""
    plane, cp = run_plane, run_plane.cp
    policy = {
        **POLICY,
        "name": "ask-above",
        "data": {"outbound": {"max_bytes": "1MB", "types": ["txt"], "approval": "10B"}},
    }
    write = "printf 'hi' > out/a.txt && printf '%020d' 0 > out/b.txt"
    turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": write}}]}]
    with ScriptedModelServerForTests([*turns, {"content": "done"}]) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(admin, "above", model.base_url, policy)
            run_id = await _start(admin, agent)
            asked: list = []
            for _ in range(600):
                asked = [
                    a for a in (await admin.get("/v1/approvals")).json() if a["run_id"] == run_id
                ]
                if asked:
                    break
                await asyncio.sleep(0.1)
            assert [a["subject"]["name"] for a in asked] == ["b.txt"]
            assert asked[0]["subject"]["size"] == 20
            got = await admin.post(f"/v1/approvals/{asked[0]['id']}", json={"decision": "approve"})
            assert got.status_code == 200, got.text
            run = await wait_end(admin, run_id)
            arts = (await admin.get(f"/v1/runs/{run_id}/artifacts")).json()
            every = (await admin.get("/v1/approvals", params={"pending": False})).json()
    assert run["status"] == "succeeded", run
    assert sorted(a["name"] for a in arts) == ["a.txt", "b.txt"]
    assert [a["status"] for a in every if a["run_id"] == run_id] == ["approved"]
    _no_sandbox(cp)


async def test_cancel_while_waiting_for_approval_closes_the_question(run_plane) -> None:
    plane, cp = run_plane, run_plane.cp
    policy = {
        **POLICY,
        "name": "ask-cancel",
        "data": {"outbound": {"max_bytes": "1MB", "types": ["txt"], "approval": True}},
    }
    with ScriptedModelServerForTests([WRITE, {"content": "done"}]) as model:
        async with plane.client(plane.admin_token) as admin:
            agent = await make_agent(admin, "askcancel", model.base_url, policy)
            run_id = await _start(admin, agent)
            for _ in range(600):
                run = (await admin.get(f"/v1/runs/{run_id}")).json()
                if run["status"] == "waiting_approval":
                    break
                await asyncio.sleep(0.1)
            assert run["status"] == "waiting_approval", run
            cancelled = await admin.post(f"/v1/runs/{run_id}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
            every = (await admin.get("/v1/approvals", params={"pending": False})).json()
            mine = [a for a in every if a["run_id"] == run_id]
            late = await admin.post(f"/v1/approvals/{mine[0]['id']}", json={"decision": "approve"})
    assert [a["status"] for a in mine] == ["cancelled"]
    assert late.status_code == 409  # a closed question cannot be answered any more
    assert not artifacts_dir(cp.settings, run_id).exists() or not list(
        artifacts_dir(cp.settings, run_id).iterdir()
    )
    _no_sandbox(cp)
