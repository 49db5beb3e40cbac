"""Destinations a policy marks `ask` (`egress.default: ask`): put to a person, once.

The proxy holds the guest's connection while the question is open. One sandbox asks once per
host:port — connections that arrive while it is open wait for the same answer — and keeps
an approval or a denial for the rest of the sandbox's life. An unanswered question (expired)
is not kept: a later attempt asks again. Without an approver (a sandbox that is not part of a
run) an `ask` destination is refused, saying so.

An approval lets the name through the rules only: the resolved address is still checked, and
an approved destination never reaches loopback, private or metadata addresses (the decision
is not `exact`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aamp.egress.rules import Decision
from aamp.policy.hosts import Host

log = logging.getLogger("aamp.egress")


@dataclass(frozen=True)
class Answer:
    """A person's answer: `status` is approved, denied or expired; `by` who gave it."""

    status: str
    by: str
    note: str | None = None


Approver = Callable[[str, int], Awaitable[Answer]]


class EgressApprovals:
    def __init__(self) -> None:
        self.approver: Approver | None = None
        self._questions: dict[tuple[str, int], asyncio.Task[Answer]] = {}

    async def judge(self, decision: Decision, host: Host, port: int) -> Decision:
        """The decision after asking, for a decision that says `ask`; others pass unchanged."""
        if not decision.ask:
            return decision
        if self.approver is None:
            return Decision(
                False,
                "default: ask",
                f"{decision.reason}; only a run can ask a person, so it is refused",
            )
        key = (str(host), port)
        question = self._questions.get(key)
        if question is None:
            question = asyncio.get_running_loop().create_task(self.approver(*key))
            self._questions[key] = question
        try:
            # Shielded: one connection giving up must not withdraw the question for the others.
            answer = await asyncio.shield(question)
        except Exception as exc:  # the approver failed: refuse now, ask again next time
            self._questions.pop(key, None)
            log.warning("egress approval for %s:%d failed: %s", *key, exc)
            return Decision(False, "default: ask", f"{decision.reason}; asking failed: {exc}")
        if answer.status == "expired" and self._questions.get(key) is question:
            del self._questions[key]
        where = f"{key[0]}:{port}"
        if answer.status == "approved":
            return Decision(
                True, f"default: ask, approved by {answer.by}", f"{where} approved by {answer.by}"
            )
        if answer.status == "denied":
            note = f" ({answer.note})" if answer.note else ""
            reason = f"{where} denied by {answer.by}{note}"
            return Decision(False, f"default: ask, denied by {answer.by}", reason)
        reason = f"{where} needed approval and nobody answered in time"
        return Decision(False, "default: ask, unanswered", reason)

    async def close(self) -> None:
        """Withdraw the open questions (the sandbox is going away)."""
        for question in self._questions.values():
            question.cancel()
        for question in list(self._questions.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await question
        self._questions.clear()
