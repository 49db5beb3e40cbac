"""What a live run does while it waits for a person.

Waiting for an approval counts against the approval timeout, not the run's wall time:
`LiveRun.pause()` stops the wall clock (an `asyncio.Timeout`) and `resume()` restarts it with
the time that was left. Several questions may be open at once; the clock runs again when the
last one is answered.

An egress question is opened by the proxy while a tool runs in the sandbox, and that tool may
end first (its own timeout, or the program gave up). `ApprovalGate` wraps the sandbox tools so
that a tool call which opened questions returns only once they are answered — the run stays
paused — and its observation says how each was answered, so the model knows to retry or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from aamp.agents.sandbox_tools import Observation, SandboxTools
from aamp.egress.approvals import Answer


@dataclass
class LiveRun:
    wall: asyncio.Timeout | None = None
    waiting: int = 0  # open questions
    questions: list[tuple[str, asyncio.Task[Answer]]] = field(default_factory=list)
    _left: float | None = None

    def begin_wait(self) -> None:
        """A question opened; the first one stops the wall clock."""
        self.waiting += 1
        if self.waiting == 1:
            self.pause()

    def end_wait(self) -> None:
        """A question closed; the last one starts the wall clock again."""
        self.waiting -= 1
        if self.waiting == 0:
            self.resume()

    def pause(self) -> None:
        wall = self.wall
        if wall is None or wall.expired() or wall.when() is None:
            return
        with contextlib.suppress(RuntimeError):  # not inside the `async with` (any more)
            left = wall.when() - asyncio.get_running_loop().time()
            wall.reschedule(None)
            self._left = left

    def resume(self) -> None:
        wall, left = self.wall, self._left
        self._left = None
        if wall is None or left is None:
            return
        with contextlib.suppress(RuntimeError):
            wall.reschedule(asyncio.get_running_loop().time() + max(left, 0.0))


class ApprovalGate:
    """The sandbox tools of one run, holding each call until the questions it opened are
    answered."""

    def __init__(self, tools: SandboxTools, live: LiveRun, approval_timeout: int) -> None:
        self.tools = tools
        self.live = live
        self.approval_timeout = approval_timeout

    async def run(self, name: str, args: dict[str, Any]) -> Observation:
        first = len(self.live.questions)
        observation = await self.tools.run(name, args)
        opened = self.live.questions[first:]
        if not opened:
            return observation
        await asyncio.wait([task for _, task in opened])
        notes = [self._note(where, task) for where, task in opened]
        return dataclasses.replace(observation, text=observation.text + "\n" + "\n".join(notes))

    def _note(self, where: str, task: asyncio.Task[Answer]) -> str:
        head = f"note: the network destination {where} needed a person's approval;"
        if task.cancelled() or task.exception() is not None:
            return f"{head} the question was withdrawn, so it was refused."
        answer = task.result()
        if answer.status == "approved":
            return f"{head} {answer.by} approved it. It is allowed from now on; retry if needed."
        if answer.status == "denied":
            why = f" ({answer.note})" if answer.note else ""
            return f"{head} {answer.by} denied it{why}. Do not try it again."
        return f"{head} nobody answered within {self.approval_timeout} s, so it was refused."
