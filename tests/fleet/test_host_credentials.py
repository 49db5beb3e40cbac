"""The one decision on a sandbox host's credential ask (`HostCredentials`), on a real store
(SQLite and PostgreSQL), a real vault and audit log: granted only for a sandbox live on that
host's current life and not past its expiry, a service its create was granted and a secret
that service uses — the value read through the vault's reader (`secret.reveal`, naming host,
sandbox and service); every refusal is `secret.refused` (deny), names the rule, and reveals
nothing. A sandbox past its expiry is refused its host's report too, and reaped."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import select, text

from aamp.catalog import Catalog
from aamp.fleet import FleetPlacer, HostFacts, HostRegistry
from aamp.fleet.credentials import HostCredentials
from aamp.fleet.link_ca import LinkCA
from aamp.fleet.links import HostLinks
from aamp.fleet.placement import Need, Placement
from aamp.fleet.sandboxes import REAP_GRACE_SECONDS, Reservation
from aamp.sandbox.wheelhouse import Wheelhouse
from aamp.store.tables import HostRow, SandboxRow
from aamp.vault import Vault

NEED = Need(driver="gvisor", image="base", cpus=0.5, memory_mb=256)


def _records(store, action: str) -> list:  # type: ignore[no-untyped-def]
    with store.engine.connect() as conn:
        sql = "SELECT actor, decision, reason FROM audit_records WHERE action = :a ORDER BY seq"
        return list(conn.execute(text(sql), {"a": action}).all())


async def test_a_host_gets_only_its_own_sandboxes_granted_secrets(settings, store, audit):
    registry = HostRegistry(store)
    tokens = {}
    for host_id in ("h1", "h2"):
        _, tokens[host_id] = registry.add(host_id, by="test")
        registry.register(host_id, tokens[host_id], HostFacts(("gvisor",), 4, 4096, 8, ()))
    placement = Placement(registry)
    placer = FleetPlacer(placement, "rep", HostLinks(LinkCA.of(settings)), Wheelhouse(settings))
    catalog = Catalog(store)
    for name, secret in (("crm", "crm_token"), ("erp", "erp_token")):
        catalog.put_service(name, upstream=f"http://{name}.test", auth="bearer",
                            secrets=[secret], header_name=None, by="test")  # fmt: skip
    vault = Vault.open(settings, store, audit)
    await vault.put("crm_token", "crm-value-1", "test")
    await vault.put("erp_token", "erp-value-2", "test")

    async def place(services: tuple[str, ...], sandbox_id: str, ttl: float = 600) -> None:
        placed = placement.place(NEED, ("h1",))
        await placer.placed(Reservation(placed, NEED), sandbox_id, ttl, services)

    await place(("crm",), "sb-aaaaaaaaaaaa")
    await place((), "sb-bbbbbbbbbbbb")
    await place(("crm",), "sb-dddddddddddd", ttl=0.05)  # its host kept it past its ttl
    await asyncio.sleep(0.1)
    credentials = HostCredentials(
        store, lambda name: catalog.get_service(name).secrets, vault, audit
    )

    def ask(host: str, sandbox: str, service: str = "crm", secret: str = "crm_token"):  # type: ignore[no-untyped-def]
        return credentials.decide(host, {"sandbox": sandbox, "service": service, "secret": secret})

    assert await ask("h1", "sb-aaaaaaaaaaaa") == {"value": "crm-value-1"}
    refused = {
        "another host's": await ask("h2", "sb-aaaaaaaaaaaa"),
        "not granted": await ask("h1", "sb-bbbbbbbbbbbb"),
        "another service's secret": await ask("h1", "sb-aaaaaaaaaaaa", "crm", "erp_token"),
        "an ungranted service": await ask("h1", "sb-aaaaaaaaaaaa", "erp", "erp_token"),
        "no sandbox": await ask("h1", "sb-cccccccccccc"),
        "malformed": await credentials.decide("h1", {"sandbox": ["x"]}),
        "a control character": await ask("h1", "sb-aaaaaaaaaaaa", "crm\x1b[31m"),
        "expired": await ask("h1", "sb-dddddddddddd"),
    }
    registry.lost_after = 0.0  # both silent from now: marked lost, their sandboxes with them
    assert sorted(h.id for h in registry.mark_lost()) == ["h1", "h2"]
    refused["lost"] = await ask("h1", "sb-aaaaaaaaaaaa")
    assert all(set(answer) == {"refused"} for answer in refused.values()), refused
    assert "not placed on host h2" in refused["another host's"]["refused"]
    assert "not granted" in refused["not granted"]["refused"]
    assert "does not use secret erp_token" in refused["another service's secret"]["refused"]
    assert "not granted" in refused["an ungranted service"]["refused"]
    assert "not live" in refused["lost"]["refused"]
    assert "expired at" in refused["expired"]["refused"]
    assert [r.actor for r in _records(store, "secret.reveal") if r.actor.startswith("host:")] == [
        "host:h1"
    ]
    denials = _records(store, "secret.refused")
    assert len(denials) == len(refused) and {d.decision for d in denials} == {"deny"}
    assert all("value" not in r for r in refused.values())


async def test_a_sandbox_past_its_expiry_is_refused_its_host_and_reaped(settings, store):
    """A host that keeps a sandbox past its ttl: its heartbeat's claim to run it is refused
    (and it is told to destroy it); `REAP_GRACE_SECONDS` later the sweep forgets it and gives
    its capacity back, exactly once whichever replica sweeps."""
    registry = HostRegistry(store)
    _, token = registry.add("h1", by="test")
    info, _ = registry.register("h1", token, HostFacts(("gvisor",), 4, 4096, 8, ()))
    placement = Placement(registry)
    placers = [
        FleetPlacer(placement, rep, HostLinks(LinkCA.of(settings)), Wheelhouse(settings))
        for rep in "ab"
    ]
    for sandbox_id, ttl in (("sb-eeeeeeeeeeee", 0.05), ("sb-ffffffffffff", 600)):
        placed = placement.place(NEED, ("h1",))
        await placers[0].placed(Reservation(placed, NEED), sandbox_id, ttl, ())
    await asyncio.sleep(0.1)
    reported = ("sb-eeeeeeeeeeee", "sb-ffffffffffff")
    unknown, refused, forgotten = placers[0].settle_report("h1", info.epoch, reported)
    assert (unknown, refused, forgotten) == (["sb-eeeeeeeeeeee"], ["sb-eeeeeeeeeeee (expired)"], [])
    assert await placers[0].reap_expired() == []  # its host's own clock acts first
    registry.clock = lambda: time.time() + REAP_GRACE_SECONDS + 1
    reaped = await asyncio.gather(*(p.reap_expired() for p in placers))
    assert sorted(reaped, key=len) == [[], [("sb-eeeeeeeeeeee", "h1")]]
    with store.session() as s:
        assert s.scalars(select(SandboxRow.id)).all() == ["sb-ffffffffffff"]
        assert s.get(HostRow, "h1").used_sandboxes == 1
