"""`HostOutbox`: what a sandbox host on another machine has for the control plane — its egress
proxies' ledger events and secret-use records (for the one audit chain) and their asks for a
service credential — handed to replicas over the link, which only replicas dial.

A replica collects with a long poll (`POST /link/collect`, `collector.py`): the items not yet
taken, each offered again after `redeliver` seconds if no replica acknowledged it (a replica
that died mid-collect), so a record reaches the chain at least once; an ask is answered
(`POST /link/asks/{id}`) with the value of one secret or a refusal. The link is mutual TLS
both ways (the replica checks the host's certificate name, the host the replica's client
certificate), so an ask is the host's own: the replica decides it knowing which host asks.

`LinkEgressSink` is the host's `EgressSink`: an event's `record` returns once a replica has
written it to the audit chain (or fails after `deliver_timeout`: the proxy counts a ledger
failure, and the event, in memory only, is lost). `LinkSecrets` is one sandbox's
`SecretReader`: each value is asked for that sandbox and the granted service using the
secret, held by the proxy connection that asked (memory only; never written, logged or
shown), and read again after `HELD_SECONDS` (a replica cannot tell a host that a secret
changed, so a remote connection uses a replaced or revoked secret for at most that long).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aamp.egress.ledger import EgressEvent
from aamp.egress.services import ServiceSet

HELD_SECONDS = 60
MAX_ITEMS = 10_000


class OutboxFull(RuntimeError):
    """The host holds as many undelivered items as it may (no replica collects)."""


@dataclass
class _Item:
    kind: str  # "egress" | "secret_use" | "ask"
    body: dict[str, Any]
    future: asyncio.Future[Any]
    offered: float = 0.0  # monotonic time last handed to a replica (0: never)
    id: str = field(default_factory=lambda: secrets.token_hex(12))


class HostOutbox:
    def __init__(
        self, *, ask_timeout: float = 15.0, deliver_timeout: float = 60.0, redeliver: float = 20.0
    ) -> None:
        self.ask_timeout, self.deliver_timeout, self.redeliver = (
            ask_timeout,
            deliver_timeout,
            redeliver,
        )
        self._items: dict[str, _Item] = {}
        self._wake = asyncio.Event()

    async def _put(self, kind: str, body: dict[str, Any], timeout: float) -> Any:
        if len(self._items) >= MAX_ITEMS:
            raise OutboxFull(f"{len(self._items)} items wait for a replica to collect them")
        item = _Item(kind, body, asyncio.get_running_loop().create_future())
        self._items[item.id] = item
        self._wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(item.future), timeout)
        finally:
            self._items.pop(item.id, None)

    async def record(self, kind: str, body: dict[str, Any]) -> None:
        """Hand one record over; returns once a replica wrote it to the audit chain."""
        await self._put(kind, body, self.deliver_timeout)

    async def ask(self, sandbox_id: str, service: str, secret: str) -> dict[str, Any]:
        """A replica's answer for one secret of `service` for `sandbox_id`: `{"value": ...}`
        or `{"refused": why}`; `TimeoutError` if no replica answers in time."""
        body = {"sandbox": sandbox_id, "service": service, "secret": secret}
        return await self._put("ask", body, self.ask_timeout)  # type: ignore[no-any-return]

    async def collect(self, ack: list[str], wait: float, limit: int = 500) -> list[dict[str, Any]]:
        """(A replica's long poll.) Settle the records `ack` names as written, then the items
        due (never offered, or offered more than `redeliver` seconds ago), waiting up to
        `wait` seconds for one."""
        for item_id in ack:
            item = self._items.get(item_id)
            if item is not None and item.kind != "ask" and not item.future.done():
                item.future.set_result(None)
        deadline = time.monotonic() + max(0.0, min(wait, 30.0))
        while True:
            now = time.monotonic()
            due = [
                i
                for i in self._items.values()
                if not i.future.done() and (not i.offered or now - i.offered >= self.redeliver)
            ][:limit]
            if due or now >= deadline:
                for i in due:
                    i.offered = now
                return [{"id": i.id, "kind": i.kind, "body": i.body} for i in due]
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(deadline - now, self.redeliver))

    def answer(self, ask_id: str, answer: dict[str, Any]) -> bool:
        """A replica's answer to one ask; False if no such ask waits (answered, timed out)."""
        item = self._items.get(ask_id)
        if item is None or item.kind != "ask" or item.future.done():
            return False
        item.future.set_result(answer)
        return True


class LinkEgressSink:
    """The host's egress ledger: every event to the control plane's audit chain."""

    def __init__(self, outbox: HostOutbox) -> None:
        self.outbox = outbox

    async def record(self, event: EgressEvent) -> None:
        await self.outbox.record("egress", event.to_dict())


class CredentialRefused(Exception):
    """The control plane refused (or did not answer) a credential ask; names no value."""


class LinkSecrets:
    """One sandbox's `SecretReader` on a host: asks the control plane over the link."""

    def __init__(
        self, outbox: HostOutbox, sandbox_id: str, services: Callable[[], ServiceSet]
    ) -> None:
        self.outbox, self.sandbox_id, self.services = outbox, sandbox_id, services

    async def reveal(self, name: str, *, purpose: str) -> str:
        service = next((s for s in self.services() if name in s.secret_names), None)
        if service is None:
            raise CredentialRefused(f"no service granted to {self.sandbox_id} uses {name!r}")
        try:
            answer = await self.outbox.ask(self.sandbox_id, service.name, name)
        except (TimeoutError, OutboxFull):
            raise CredentialRefused("no replica answered the credential ask in time") from None
        value = answer.get("value")
        if not isinstance(value, str):
            raise CredentialRefused(str(answer.get("refused", "refused"))[:300])
        return value

    def changes(self, name: str) -> int:
        return int(time.monotonic() // HELD_SECONDS)

    async def record_use(self, service: str, *, purpose: str, details: dict[str, Any]) -> None:
        body = {"sandbox": self.sandbox_id, "service": service, "purpose": purpose}
        await self.outbox.record("secret_use", {**body, "details": details})
