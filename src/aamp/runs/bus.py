"""Wakes live readers of a run's step log when a step is stored.

The step log in the store is the truth; this only says "look again". A reader takes its
waiter *before* reading the store, so a step stored between its read and its wait still
wakes it.
"""

from __future__ import annotations

import asyncio
import contextlib


class EventBus:
    def __init__(self) -> None:
        self._waiters: dict[str, asyncio.Event] = {}

    def waiter(self, run_id: str) -> asyncio.Event:
        return self._waiters.setdefault(run_id, asyncio.Event())

    def notify(self, run_id: str) -> None:
        event = self._waiters.pop(run_id, None)
        if event is not None:
            event.set()

    @staticmethod
    async def wait(event: asyncio.Event, timeout: float) -> bool:
        """True if woken, False after `timeout` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
            return True
        return False
