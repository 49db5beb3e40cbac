"""What a sandbox's egress proxy just decided, for a tool that has to explain it.

`RecentEgress` is an `EgressSink` in front of the real ledger: every event goes on to the
inner sink unchanged (durability is the inner sink's), and for the sandboxes a tool watches
it also keeps the last events in memory, numbered. The browser tool takes a `mark()` before
an action and asks for `since(mark)` after it: the refusals in between are what the page
was refused, with the rule that refused it — told by the host's own proxy, not by anything
the guest or a web page could say.

Only watched sandboxes cost memory (a bounded deque each), and `forget` drops one when its
sandbox is destroyed.

`EgressView` is what a tool holds: `RecentView` for a sandbox on this host, and for one on
another host `aamp.fleet.link_egress.LinkEgressView`, which asks the host's own view over the
link — hence both methods are coroutines.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from aamp.egress.ledger import EgressEvent, EgressSink

KEPT_PER_SANDBOX = 1000


class EgressView(Protocol):
    """One sandbox's recent egress events, for one tool."""

    async def mark(self) -> int:
        """A point in the sandbox's event sequence; `since` returns what came after it."""
        ...

    async def since(self, mark: int) -> list[EgressEvent]:
        """The sandbox's events after `mark` (at most `KEPT_PER_SANDBOX`, the latest)."""
        ...


class RecentView:
    """The `EgressView` of a sandbox on this host, over its `RecentEgress` deque."""

    def __init__(self, events: deque[tuple[int, EgressEvent]], counter: list[int]) -> None:
        self._events = events
        self._counter = counter

    async def mark(self) -> int:
        return self._counter[0]

    async def since(self, mark: int) -> list[EgressEvent]:
        return [event for seq, event in self._events if seq > mark]


class RecentEgress:
    def __init__(self, inner: EgressSink, kept: int = KEPT_PER_SANDBOX) -> None:
        self.inner = inner
        self.kept = kept
        self._watched: dict[str, tuple[deque[tuple[int, EgressEvent]], list[int]]] = {}

    async def record(self, event: EgressEvent) -> None:
        watched = self._watched.get(event.sandbox_id)
        if watched is not None:
            events, counter = watched
            counter[0] += 1
            events.append((counter[0], event))
        await self.inner.record(event)

    def view(self, sandbox_id: str) -> RecentView:
        """Start keeping `sandbox_id`'s events (if not yet) and return a view of them."""
        events, counter = self._watched.setdefault(sandbox_id, (deque(maxlen=self.kept), [0]))
        return RecentView(events, counter)

    def forget(self, sandbox_id: str) -> None:
        self._watched.pop(sandbox_id, None)
