"""Rebuilding the loop's state from a run's stored steps (`aamp.agents.loop_replay`): the
conversation exactly as the loop built it, the counters, the calls of the last reply not yet
started — and never a tool call repeated: a log that ends inside one cannot go on."""

from __future__ import annotations

import pytest

from aamp.agents.loop_replay import NotResumable, replay
from aamp.agents.model import ToolCall


def _model(step: int, *calls: tuple[str, str], content: str | None = None) -> tuple[str, dict]:
    return (
        "model.call",
        {
            "step": step,
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "content": content,
            "tool_calls": [{"id": i, "name": "shell", "arguments": a} for i, a in calls],
        },
    )


def _call(call_id: str) -> tuple[str, dict]:
    return ("tool.call", {"step": 1, "id": call_id, "name": "shell", "arguments": "{}"})


def _result(call_id: str, text: str) -> tuple[str, dict]:
    return ("tool.result", {"step": 1, "id": call_id, "name": "shell", "ok": True, "text": text})


def test_the_conversation_and_counters_are_rebuilt_and_unstarted_calls_are_pending() -> None:
    state = replay(
        [
            ("run.queued", {"task": "t"}),
            ("sandbox.created", {"sandbox": "sb-1"}),
            _model(1, ("c1", '{"command": "ls"}')),
            _call("c1"),
            _result("c1", "a.txt"),
            ("screenshot", {"png_b64": "AAAA"}),
            _model(2, ("c2", '{"command": "one"}'), ("c3", '{"command": "two"}')),
            _call("c2"),
            _result("c2", "1"),
        ]
    )
    assert state.messages == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command": "one"}'},
                },
                {
                    "id": "c3",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command": "two"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "1"},
    ]
    assert (state.steps, state.prompt_tokens, state.completion_tokens) == (2, 20, 4)
    assert state.pending == [ToolCall("c3", "shell", '{"command": "two"}')]


def test_a_run_stopped_before_its_first_model_call_starts_afresh() -> None:
    state = replay([("run.queued", {}), ("run.started", {})])
    assert (state.messages, state.steps, state.pending) == ([], 0, [])


def test_a_log_ending_inside_a_tool_call_cannot_go_on() -> None:
    with pytest.raises(
        NotResumable, match=r"inside tool call shell \(c1\), which is never repeated"
    ):
        replay([_model(1, ("c1", "{}")), _call("c1")])


def test_a_log_after_the_model_answered_cannot_go_on() -> None:
    with pytest.raises(NotResumable, match="the model had answered"):
        replay(
            [_model(1, ("c1", "{}")), _call("c1"), _result("c1", "x"), _model(2, content="done")]
        )
