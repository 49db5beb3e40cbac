"""The agent loop: model → tool calls in the sandbox → observations, until a final answer or
a limit.

Every step leaves an event through `emit` before the loop goes on (the run service stores it,
streams it and audits it). Tool arguments are checked against the tool's schema first; an
invalid call becomes an error observation for the model and never reaches the sandbox.
Observations are truncated to the definition's budget with a note; a browser screenshot goes
to models that take images (`browser.images`) as image content (`model_images`). The loop
measures where its time goes (model, sandbox, and the rest: the control plane's own overhead
per step).

Wall time is enforced by the caller (the run service wraps the loop in a timeout); steps and
tokens are enforced here.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aamp.agents.definition import AgentDefinition
from aamp.agents.loop_replay import LoopState
from aamp.agents.model import ModelClient, ToolCall
from aamp.agents.model_images import show_image
from aamp.agents.sandbox_tools import Observation
from aamp.agents.tools import ToolSet, truncate

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]


class ToolExecutor(Protocol):
    """Runs one checked tool call (`aamp.agents.sandbox_tools.SandboxTools`, or a wrapper)."""

    async def run(self, name: str, args: dict[str, Any]) -> Observation: ...


TASK_TEMPLATE = """{task}

The sandbox's working directory is /workspace.{inputs}
Write any files that are results of the task to /workspace/out; they become the run's artifacts.
When you are done, answer without calling a tool."""


@dataclass
class LoopOutcome:
    status: str  # "succeeded" | "failed"
    reason: str | None
    answer: str | None
    steps: int
    prompt_tokens: int
    completion_tokens: int
    model_seconds: float = 0.0
    tool_seconds: float = 0.0
    overhead_ms: list[float] = field(default_factory=list)


def first_message(task: str, inputs: list[str]) -> str:
    listed = ""
    if inputs:
        listed = "\nInput files: " + ", ".join(f"/workspace/in/{n}" for n in inputs) + "."
    return TASK_TEMPLATE.format(task=task, inputs=listed)


async def run_loop(
    definition: AgentDefinition,
    task: str,
    inputs: list[str],
    model: ModelClient,
    tools: ToolSet,
    executor: ToolExecutor,
    emit: Emit,
    resumed: LoopState | None = None,
) -> LoopOutcome:
    """Run the loop to its end; `resumed` (`loop_replay.replay`) goes on from an interrupted
    run's stored steps: the calls of its last reply not yet started first, then the model."""
    limits = definition.limits
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": definition.system_prompt},
        {"role": "user", "content": first_message(task, inputs)},
    ]
    out = LoopOutcome("failed", None, None, 0, 0, 0)
    schemas = tools.openai()

    async def run_calls(calls: list[ToolCall] | tuple[ToolCall, ...], step: int) -> float:
        """Run one reply's tool calls in turn; returns the seconds spent in the sandbox."""
        tool_seconds = 0.0
        for call in calls:
            args, problem = tools.check_call(call.name, call.arguments)
            await emit(
                "tool.call",
                {"step": step, "id": call.id, "name": call.name, "arguments": call.arguments},
            )
            if problem is not None:
                observation = Observation(f"error: {problem}", ok=False, detail={"invalid": True})
                seconds = 0.0
            else:
                assert args is not None
                began = time.monotonic()
                observation = await executor.run(call.name, args)
                seconds = time.monotonic() - began
            tool_seconds += seconds
            text = truncate(observation.text, limits.observation_bytes)
            result: dict[str, Any] = {
                "step": step,
                "id": call.id,
                "name": call.name,
                "ok": observation.ok,
                "seconds": round(seconds, 6),
                "detail": observation.detail,
                "text": text,
                "truncated": text != observation.text,
            }
            await emit("tool.result", result)
            if observation.screenshot is not None:
                await emit(
                    "screenshot",
                    {
                        "step": step,
                        "id": call.id,
                        "sha256": hashlib.sha256(observation.screenshot).hexdigest(),
                        "png_b64": base64.b64encode(observation.screenshot).decode(),
                    },
                )
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
            if observation.model_image is not None and definition.browser.images:
                show_image(messages, observation.model_image, call.id)
        return tool_seconds

    if resumed is not None:
        messages += resumed.messages
        out.steps = resumed.steps
        out.prompt_tokens, out.completion_tokens = resumed.prompt_tokens, resumed.completion_tokens
        out.tool_seconds += await run_calls(resumed.pending, resumed.steps)
        if resumed.note:
            messages.append({"role": "user", "content": resumed.note})
    while True:
        if out.steps >= limits.max_steps:
            out.reason = f"max_steps: reached the limit of {limits.max_steps} steps"
            return out
        remaining = limits.max_tokens - out.prompt_tokens - out.completion_tokens
        if remaining <= 0:
            out.reason = f"max_tokens: used {limits.max_tokens} tokens or more"
            return out
        step_started = time.monotonic()
        out.steps += 1
        step = out.steps
        reply = await model.complete(messages, schemas, None)
        out.model_seconds += reply.seconds
        out.prompt_tokens += reply.prompt_tokens
        out.completion_tokens += reply.completion_tokens
        await emit(
            "model.call",
            {
                "step": step,
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "seconds": round(reply.seconds, 6),
                "attempts": reply.attempts,
                "finish_reason": reply.finish_reason,
                "content": reply.content,
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls
                ],
            },
        )
        messages.append(reply.raw_message)
        if not reply.tool_calls:
            out.status, out.answer = "succeeded", reply.content or ""
            out.overhead_ms.append(_overhead(step_started, reply.seconds, 0.0))
            return out
        tool_seconds = await run_calls(reply.tool_calls, step)
        out.tool_seconds += tool_seconds
        out.overhead_ms.append(_overhead(step_started, reply.seconds, tool_seconds))


def _overhead(started: float, model_seconds: float, tool_seconds: float) -> float:
    """Milliseconds of one step spent neither in the model nor in the sandbox."""
    total = time.monotonic() - started
    return round(max(0.0, total - model_seconds - tool_seconds) * 1000, 3)


def summarise(out: LoopOutcome) -> dict[str, Any]:
    ordered = sorted(out.overhead_ms)
    p50 = ordered[len(ordered) // 2] if ordered else None
    return {
        "steps": out.steps,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "model_seconds": round(out.model_seconds, 6),
        "tool_seconds": round(out.tool_seconds, 6),
        "overhead_ms": out.overhead_ms,
        "overhead_ms_p50": p50,
    }
