"""Where an interrupted run's loop stood, rebuilt from the steps it emitted (`loop.py`), so
that another control-plane process can go on from there without repeating a step.

The conversation is the model's replies (`model.call`: content and tool calls, exactly the
assistant message the loop appended) and the tool results (`tool.result`: the text the model
was given). A tool call that was started (`tool.call`) but has no result is never repeated —
its effects (a file, a service call, a click) are unknown — so such a run cannot go on; nor
can one whose model already answered (what is left, collecting artifacts, needed the sandbox
that was lost). Calls of the last reply that were never started run next. Screenshots shown
to the model as images are not shown again (their pixels are in the step log, the model part
is not).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aamp.agents.model import ToolCall, assistant_message


class NotResumable(Exception):
    """The run cannot go on from its step log; the message says why."""


@dataclass
class LoopState:
    """The loop's conversation and counters after its last stored step."""

    messages: list[dict[str, Any]]  # after the system prompt and the task
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    pending: list[ToolCall] = field(default_factory=list)  # of the last reply, not yet started
    note: str | None = None  # told the model before its next call


def replay(events: Iterable[tuple[str, dict[str, Any]]]) -> LoopState:
    """The state after `events` (type, data), oldest first; `NotResumable` if it cannot go on."""
    state = LoopState([])
    started: dict[str, str] = {}  # tool call id -> name, started without a result
    answered = False
    for type_, data in events:
        if type_ == "model.call":
            calls = [
                ToolCall(str(c["id"]), str(c["name"]), str(c.get("arguments") or ""))
                for c in data.get("tool_calls") or []
            ]
            state.messages.append(assistant_message(data.get("content"), calls))
            state.steps = int(data.get("step") or state.steps + 1)
            state.prompt_tokens += int(data.get("prompt_tokens") or 0)
            state.completion_tokens += int(data.get("completion_tokens") or 0)
            state.pending = calls
            answered = not calls
        elif type_ == "tool.call":
            call_id = str(data.get("id"))
            started[call_id] = str(data.get("name"))
            state.pending = [c for c in state.pending if c.id != call_id]
        elif type_ == "tool.result":
            call_id = str(data.get("id"))
            started.pop(call_id, None)
            state.messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": str(data.get("text") or "")}
            )
    if started:
        call_id, name = next(iter(started.items()))
        raise NotResumable(
            f"the step log ends inside tool call {name} ({call_id}), which is never repeated: "
            "its effects are unknown"
        )
    if answered:
        raise NotResumable(
            "the model had answered; the artifacts were being collected from the sandbox, "
            "which is gone"
        )
    return state
