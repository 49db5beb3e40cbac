"""`LinkEgressView`: a replica's `EgressView` of a sandbox on another host — its host's own
view of what its proxy decided (`GET /link/sandboxes/{id}/egress`, `link_server.py`), asked
for at each `mark` and `since`.

What the host answers is untrusted bytes: at most `MAX_VIEW_ANSWER` are read, at most
`MAX_VIEW_EVENTS` events taken (what a host keeps: `KEPT_PER_SANDBOX`), and every event is
checked field by field as a collected one is (`reports.egress_event`: types, sizes, closed
sets, a service the sandbox was granted), and must be this sandbox's. Anything else refuses
the whole answer (`HostMisbehaved`, 502, recorded as `host.answer_refused` by the link):
a tool explaining a refusal never shows a host's made-up text.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection

from aamp.egress.ledger import EgressEvent
from aamp.egress.recent import KEPT_PER_SANDBOX
from aamp.fleet.link_client import LinkClient
from aamp.fleet.reports import NotTaken, count, egress_event, fields

MAX_VIEW_ANSWER = 4 * 2**20
MAX_VIEW_EVENTS = KEPT_PER_SANDBOX


class LinkEgressView:
    """The egress view of `sandbox_id` on `link`'s host; `granted()` reads the services its
    create (or its last update) was granted."""

    def __init__(
        self,
        link: LinkClient,
        sandbox_id: str,
        granted: Callable[[], Awaitable[Collection[str]]],
    ) -> None:
        self.link, self.sandbox_id, self._granted = link, sandbox_id, granted
        self._path = f"/link/sandboxes/{sandbox_id}/egress"

    async def mark(self) -> int:
        mark, _ = await self._ask(None)
        return mark

    async def since(self, mark: int) -> list[EgressEvent]:
        _, events = await self._ask(mark)
        return events

    async def _ask(self, after: int | None) -> tuple[int, list[EgressEvent]]:
        params = {"after": str(after)} if after is not None else {}
        what = f"GET {self._path}"
        _, body = await self.link.request("GET", self._path, MAX_VIEW_ANSWER, params=params)
        try:
            return await self._checked(json.loads(body), after is None)
        except ValueError as exc:  # NotTaken, and JSON that is not
            raise await self.link.refuse(f"{what}: {exc}") from None

    async def _checked(self, answer: object, only_mark: bool) -> tuple[int, list[EgressEvent]]:
        got, _ = fields(
            "an egress view", answer, {"mark": count(), "events": lambda name, value: value}
        )
        listed = got["events"]
        if not isinstance(listed, list) or len(listed) > MAX_VIEW_EVENTS:
            raise NotTaken(f"its events are not a list of at most {MAX_VIEW_EVENTS}")
        if only_mark and listed:
            raise NotTaken("a mark was asked for and events came with it")
        granted = await self._granted() if listed else ()
        events = [egress_event(item, granted) for item in listed]
        other = next((e.sandbox_id for e in events if e.sandbox_id != self.sandbox_id), None)
        if other is not None:
            raise NotTaken(f"an event of sandbox {other[:64]!r} in {self.sandbox_id}'s view")
        return got["mark"], events
