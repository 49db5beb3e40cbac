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
`LinkLeaves` is one sandbox's `LeafSource`: for an HTTPS service's host it makes a key (in
memory only) and asks a replica to sign a certificate for it (a CSR naming that one host, for
that sandbox and the granted service), so the guest is shown a leaf of the installation's
one egress CA, which the host never holds; each is kept until shortly before it expires
(`LEAF_RENEW_BEFORE` of the replica's `HOST_LEAF_VALIDITY`). `LinkApprover` is one
sandbox's egress approver (`egress.default: ask`): each destination's question goes to the one
replica whose run drives the sandbox (it named itself at `/link/sandboxes/ID/approver`:
`answerers`), which puts it to a person through the run's approvals as on its own host; its
answer comes back, and no answer in time is a denial.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import secrets
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from aamp.egress.approvals import Answer
from aamp.egress.ca import LeafCache, LeafRefused, leaf_context, san_for
from aamp.egress.intercept import tls_server_name
from aamp.egress.ledger import EgressEvent
from aamp.egress.services import ServiceSet

HELD_SECONDS = 60
MAX_ITEMS = 10_000
# Items a replica answers (the others it acknowledges once written); an "approve" is handed
# only to the replica that answers for its sandbox.
ASKS = ("ask", "leaf", "approve")
# A host's leaf is asked again this long before it expires (the replica signs them for an
# hour: `aamp.fleet.leaves.HOST_LEAF_VALIDITY`).
LEAF_RENEW_BEFORE = dt.timedelta(minutes=10)


class OutboxFull(RuntimeError):
    """The host holds as many undelivered items as it may (no replica collects)."""


@dataclass
class _Item:
    kind: str  # "egress" | "secret_use" | "ask" | "leaf" | "approve"
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
        # sandbox id -> the replica whose run answers its egress questions
        self.answerers: dict[str, str] = {}

    def answer_for(self, sandbox_id: str, replica: str | None) -> None:
        """`replica` answers `sandbox_id`'s egress questions from now on (None: nobody)."""
        if replica is None:
            self.answerers.pop(sandbox_id, None)
        else:
            self.answerers[sandbox_id] = replica
        self._wake.set()  # a question waiting for it is due to that replica now

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

    async def ask_leaf(self, sandbox_id: str, service: str, name: str, csr: str) -> dict[str, Any]:
        """A replica's answer to a certificate request (`csr`, PEM) for `name`, the host of
        `service`, for `sandbox_id`: `{"certificate": PEM}` or `{"refused": why}`;
        `TimeoutError` if no replica answers in time."""
        body = {"sandbox": sandbox_id, "service": service, "name": name, "csr": csr}
        return await self._put("leaf", body, self.ask_timeout)  # type: ignore[no-any-return]

    async def approve(
        self, sandbox_id: str, host: str, port: int, timeout: float
    ) -> dict[str, Any]:
        """The answer of the replica answering for `sandbox_id` to whether it may reach
        `host:port`: `{"status": approved|denied|expired, "by": ..., "note": ...}`;
        `TimeoutError` if none comes within `timeout`."""
        body = {"sandbox": sandbox_id, "host": host, "port": port}
        return await self._put("approve", body, timeout)  # type: ignore[no-any-return]

    def _due_to(self, item: _Item, replica: str | None) -> bool:
        return item.kind != "approve" or (
            replica is not None and self.answerers.get(item.body["sandbox"]) == replica
        )

    async def collect(
        self, ack: list[str], wait: float, limit: int = 500, replica: str | None = None
    ) -> list[dict[str, Any]]:
        """(A replica's long poll; `replica` is who collects.) Settle the records `ack` names
        as written, then the items due (never offered, or offered more than `redeliver`
        seconds ago; a question only to the replica answering for its sandbox), waiting up
        to `wait` seconds for one."""
        for item_id in ack:
            item = self._items.get(item_id)
            if item is not None and item.kind not in ASKS and not item.future.done():
                item.future.set_result(None)
        deadline = time.monotonic() + max(0.0, min(wait, 30.0))
        while True:
            now = time.monotonic()
            due = [
                i
                for i in self._items.values()
                if not i.future.done()
                and (not i.offered or now - i.offered >= self.redeliver)
                and self._due_to(i, replica)
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
        if item is None or item.kind not in ASKS or item.future.done():
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


class LinkApprover:
    """One sandbox's egress `Approver` on a host: asks the replica answering for it."""

    def __init__(self, outbox: HostOutbox, sandbox_id: str, timeout: float) -> None:
        self.outbox, self.sandbox_id, self.timeout = outbox, sandbox_id, timeout

    async def __call__(self, host: str, port: int) -> Answer:
        try:
            answer = await self.outbox.approve(self.sandbox_id, host, port, self.timeout)
        except (TimeoutError, OutboxFull):
            return Answer("expired", "nobody")
        status = answer.get("status")
        if status not in ("approved", "denied", "expired"):
            return Answer("denied", "system", "the control plane's answer was not one")
        note = answer.get("note")
        return Answer(
            str(status), str(answer.get("by", "?"))[:200], str(note)[:500] if note else None
        )


class LinkLeaves:
    """One sandbox's `LeafSource` on a host: leaves signed by a replica, over the link."""

    def __init__(
        self,
        outbox: HostOutbox,
        sandbox_id: str,
        services: Callable[[], ServiceSet],
        scratch_dir: Path,
    ) -> None:
        self.outbox, self.sandbox_id, self.services = outbox, sandbox_id, services
        self.scratch_dir = scratch_dir
        self._key = ec.generate_private_key(ec.SECP256R1())  # this sandbox's, memory only
        self._key_pem = self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self._cache = LeafCache(LEAF_RENEW_BEFORE, size=64)

    def _request(self, name: str) -> str:
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
            .add_extension(x509.SubjectAlternativeName([san_for(name)]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return csr.public_bytes(serialization.Encoding.PEM).decode()

    async def context_for(self, host: str) -> ssl.SSLContext:
        cached = self._cache.get(host)
        if cached is not None:
            return cached
        at = [s for s in self.services() if s.tls and tls_server_name(s.host) == host]
        service = at[0] if at else None
        if service is None:
            raise LeafRefused(f"no HTTPS service granted to {self.sandbox_id} is at {host}")
        try:
            answer = await self.outbox.ask_leaf(
                self.sandbox_id, service.name, host, self._request(host)
            )
        except (TimeoutError, OutboxFull):
            raise LeafRefused("no replica answered the certificate request in time") from None
        pem = answer.get("certificate")
        if not isinstance(pem, str):
            raise LeafRefused(str(answer.get("refused", "refused"))[:300])
        try:
            cert = x509.load_pem_x509_certificate(pem.encode())
        except ValueError:
            raise LeafRefused("the replica's answer is not a certificate") from None
        if cert.public_key() != self._key.public_key():
            raise LeafRefused("the replica's certificate is not for this sandbox's key")
        context = leaf_context(pem.encode(), self._key_pem, self.scratch_dir)
        self._cache.put(host, context, cert.not_valid_after_utc)
        return context
