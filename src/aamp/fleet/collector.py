"""`HostCollectors`: each replica's collection from the sandbox hosts on other machines, over
their links (which only replicas dial, so a host hands things over when asked:
`host_outbox.py`).

One task per linked host that is not lost, kept in step with the registry at every fleet
tick (`sync`). Each long-polls the host's `collect` and, for every item:

- an egress event: written to the audit chain (`AuditEgressSink`, the same records a local
  proxy writes, naming the host), then acknowledged in the next poll — so the host's proxy
  learns it is durable;
- a secret-use record: written through the vault (`secret.use`, actor the host);
- a credential ask: decided by `HostCredentials` (the one decision, recorded) and answered at
  once, beside the poll;
- a leaf certificate request (an HTTPS service's host, for one sandbox): decided and signed
  by `HostLeaves` (`leaves.py`, recorded), answered the same way;
- an egress question (`egress.default: ask`) of a sandbox whose run this replica drives (the
  host hands it only to the replica that named itself for that sandbox: `HostOutbox.
  answer_for`): put to a person through the run's approvals, by the approver the run set
  (`SandboxManager.remote_approver`), exactly as on the replica's own host, and the answer
  sent back; one whose run is gone here is denied. One question is answered once, however
  often the host offers it again meanwhile.

A host is untrusted for what it reports: an event or use record is written only for a sandbox
its host may report for (placed on it, live in its current life, not past its expiry: the one
rule, `sandboxes.refusal`), and only with every field of its type, size and set, any service
one the sandbox was granted (`reports.py`); the rest of one answer is recorded in one
`host.report_refused` (deny), each dropped record with why.
Every replica collects from every host; an item goes to one of them (the host offers it again
only if not acknowledged in time), so a record is written at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from aamp.audit import AuditSink
from aamp.egress.approvals import Approver
from aamp.egress.ledger import AuditEgressSink
from aamp.errors import AampError
from aamp.fleet import reports
from aamp.fleet.credentials import HostCredentials
from aamp.fleet.host_outbox import ASKS
from aamp.fleet.leaves import HostLeaves
from aamp.fleet.link_client import MAX_LIST_ANSWER, LinkClient
from aamp.fleet.links import HostLinks
from aamp.fleet.registry import HostRegistry
from aamp.fleet.reports import NotTaken
from aamp.fleet.sandboxes import granted_services, refusal
from aamp.sandbox.driver import SANDBOX_ID_RE
from aamp.store.tables import HostRow
from aamp.store.timestamps import now
from aamp.vault import Vault

log = logging.getLogger("aamp.fleet.collect")
POLL_SECONDS = 20.0
RETRY_SECONDS = 2.0
# What one collect answer may hold (a host hands over at most 500, `HostOutbox.collect`), and
# how many of a host's credential asks are answered at once: beyond either the host is
# misbehaving, and a replica must not let one host fill its audit log or its database.
MAX_ITEMS = 500
MAX_ASKS = 16
MAX_QUESTIONS = 64  # egress questions of one host put to people at once (they wait minutes)


class HostCollectors:
    def __init__(
        self,
        registry: HostRegistry,
        links: HostLinks,
        own_host: str,
        credentials: HostCredentials,
        audit: AuditSink,
        vault: Vault,
        leaves: HostLeaves | None = None,
        approvers: Callable[[str], Approver | None] | None = None,
    ) -> None:
        """`approvers(sandbox_id)`: who answers the egress questions of a sandbox a run here
        drives on another host (`SandboxManager.remote_approver`)."""
        self.registry, self.links, self.own_host = registry, links, own_host
        self.credentials, self.audit, self.vault = credentials, audit, vault
        self.leaves, self.approvers = leaves, approvers
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    def _hosts(self) -> set[tuple[str, str]]:
        with self.registry.store.session() as s:
            rows = s.execute(
                select(HostRow.id, HostRow.link_address).where(
                    HostRow.link_address.is_not(None), HostRow.state != "lost"
                )
            ).all()
        return {(r.id, r.link_address) for r in rows if r.id != self.own_host}

    async def sync(self) -> None:
        """Collect from exactly the linked hosts that are not lost (and not this replica's)."""
        wanted = await self.registry.store.run(self._hosts)
        for key in [k for k in self._tasks if k not in wanted or self._tasks[k].done()]:
            await self._stop(key)
        for key in wanted - set(self._tasks):
            link = self.links.client(*key)
            self._tasks[key] = asyncio.create_task(self._collect(link), name=f"collect-{key[0]}")

    async def _stop(self, key: tuple[str, str]) -> None:
        task = self._tasks.pop(key)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def stop(self) -> None:
        for key in list(self._tasks):
            await self._stop(key)

    async def _collect(self, link: LinkClient) -> None:
        ack: list[str] = []
        answering: set[asyncio.Task[None]] = set()
        asking: dict[str, asyncio.Task[None]] = {}  # questions put to people, by item id
        sink = AuditEgressSink(self.audit, host=link.host_id)
        try:
            while True:
                try:
                    _, body = await link.request(
                        "POST",
                        "/link/collect",
                        MAX_LIST_ANSWER,
                        json={"ack": ack, "wait": POLL_SECONDS, "replica": self.own_host},
                        timeout=POLL_SECONDS + 30,
                    )
                    answer = json.loads(body)
                    items = answer["items"]
                    if isinstance(items, list) and len(items) > MAX_ITEMS:
                        raise await link.refuse(f"a collect answer of {len(items)} items")
                    if answer.get("idle") is True:
                        # Nothing is ever collected here (a replica's own host): ask seldom,
                        # holding no request open on its link.
                        await asyncio.sleep(POLL_SECONDS)
                except (
                    AampError,
                    ValueError,
                    KeyError,
                    TypeError,
                    AttributeError,
                    RecursionError,
                ) as exc:
                    # Unreachable, or an answer that is not one: the host offers it again.
                    log.debug("collecting from host %s: %s", link.host_id, exc)
                    ack = []  # offered again by the host once due
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                ack = []
                refused: list[str] = []
                for item in items if isinstance(items, list) else []:
                    if not isinstance(item, dict) or not isinstance(item.get("body"), dict):
                        continue
                    if item.get("kind") == "approve":
                        item_id = str(item.get("id"))[:64]
                        if item_id in asking:  # offered again while a person is asked
                            continue
                        if len(asking) >= MAX_QUESTIONS:
                            refused.append("a question over the limit of questions at once")
                            continue
                        task = asyncio.create_task(self._put_question(link, item))
                        asking[item_id] = task
                        task.add_done_callback(lambda _, i=item_id: asking.pop(i, None))
                    elif item.get("kind") in ASKS:
                        if len(answering) >= MAX_ASKS:  # its ask times out on the host
                            refused.append("an ask over the limit of asks at once")
                            continue
                        task = asyncio.create_task(self._answer(link, item))
                        answering.add(task)
                        task.add_done_callback(answering.discard)
                    elif await self._write(link.host_id, item, sink, refused):
                        ack.append(str(item.get("id"))[:64])
                if refused:
                    await self._report_refused(link.host_id, refused)
        finally:
            for task in [*answering, *asking.values()]:
                task.cancel()

    async def _answer(self, link: LinkClient, item: dict[str, Any]) -> None:
        try:
            if item.get("kind") == "leaf":
                if self.leaves is None:
                    answer = {"refused": "this replica signs no leaf certificates"}
                else:
                    answer = await self.leaves.decide(link.host_id, item["body"])
            else:
                answer = await self.credentials.decide(link.host_id, item["body"])
            await link.request("POST", f"/link/asks/{item.get('id')}", json=answer)
        except Exception:  # the host's ask times out and its request is refused there
            log.exception("answering an ask of host %s", link.host_id)

    async def _put_question(self, link: LinkClient, item: dict[str, Any]) -> None:
        """One egress question of a sandbox on `link`'s host: to the run's person, and the
        answer back to the host."""
        body = item["body"]
        sandbox_id, host, port = body.get("sandbox"), body.get("host"), body.get("port")
        try:
            well_formed = (
                isinstance(host, str)
                and 0 < len(host) <= 255
                and host.isprintable()
                and isinstance(port, int)
                and 0 < port < 65536
                and await self._may_report(link.host_id, sandbox_id)
            )
            approver = None
            if well_formed and self.approvers is not None:  # an id the one rule took
                approver = self.approvers(sandbox_id)
            if not well_formed:
                shown = str(sandbox_id).encode("unicode_escape").decode()[:64]
                await self._report_refused(link.host_id, [f"a question of {shown}"])
                answer = {"status": "denied", "by": "system", "note": "not a question of yours"}
            elif approver is None:
                note = f"no run on replica {self.own_host} drives sandbox {sandbox_id}"
                await self._report_refused(link.host_id, [f"a question of {sandbox_id}: {note}"])
                answer = {"status": "denied", "by": "system", "note": note}
            else:
                # A task of its own, as the proxy's own approvals make one: the run holds the
                # tool call that opened the question until that task's answer.
                given = await asyncio.create_task(approver(host, port))
                answer = {"status": given.status, "by": given.by, "note": given.note}
            await link.request("POST", f"/link/asks/{item.get('id')}", json=answer)
        except Exception:  # the host's question times out there: a denial
            log.exception("answering an egress question of host %s", link.host_id)

    async def _may_report(self, host_id: str, sandbox_id: object) -> bool:
        why, _ = await self.registry.store.run(self._standing, host_id, sandbox_id)
        return why is None

    def _standing(self, host_id: str, sandbox_id: object) -> tuple[str | None, list[str]]:
        """(Blocking.) Why `host_id` may not report for `sandbox_id` (None if it may: the one
        rule, `sandboxes.refusal`), and the services the sandbox was granted."""
        if not isinstance(sandbox_id, str) or not SANDBOX_ID_RE.fullmatch(sandbox_id):
            return "a record names no sandbox id", []
        with self.registry.store.session() as s:
            why = refusal(s, host_id, sandbox_id, now())
            return why, granted_services(s, sandbox_id) if why is None else []

    async def _write(
        self, host_id: str, item: dict[str, Any], sink: AuditEgressSink, refused: list[str]
    ) -> bool:
        """Write one record (True: acknowledge it); one refused is dropped (True too, recorded
        as refused) — offering it again would not make it right: a kind not collected, a
        sandbox its host may not report for (not its own, not live, past its expiry), or a
        field not of its type, size or set (`reports.py`)."""
        body, kind = item["body"], item.get("kind")
        sandbox_id = body.get("sandbox_id" if kind == "egress" else "sandbox")
        what = f"{str(kind)[:32]} of {str(sandbox_id)[:64]}"
        if kind not in ("egress", "secret_use"):
            refused.append(what)
            return True
        why, granted = await self.registry.store.run(self._standing, host_id, sandbox_id)
        try:
            if why is not None:
                raise NotTaken(why)
            if kind == "egress":
                await sink.record(reports.egress_event(body, granted))
            else:
                use = reports.secret_use(body, granted)
                await self.vault.record_use(
                    f"service:{use['service']}",
                    purpose=use["purpose"],
                    details={**use["details"], "sandbox": sandbox_id, "host": host_id},
                    actor=f"host:{host_id}",
                )
        except NotTaken as exc:
            refused.append(f"{what}: {str(exc)[:200]}")
        except Exception:  # whatever the audit still refuses (its own rules): dropped
            log.warning("host %s: a malformed %s record dropped", host_id, kind, exc_info=True)
            refused.append(f"malformed {what}")
        return True

    async def _report_refused(self, host_id: str, refused: list[str]) -> None:
        await self.audit.record(
            actor=f"host:{host_id}",
            action="host.report_refused",
            resource=f"host:{host_id}",
            decision="deny",
            reason=f"host {host_id} handed over {len(refused)} records it may not report",
            details={"records": refused[:50]},
        )
