"""The host registry through the API: two control-plane replicas on one real PostgreSQL, hosts
that register with their own tokens and real links (`served_link.py`) and heartbeat with the
secret their registration returned, lost detection by a real timer, drain and remove; and the
single-host SQLite plane registering its own host on the same path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from api_plane import Plane, running_replicas
from driver_double import DriverDouble
from served_link import ServedLink, served_link
from sqlalchemy import select, text

from aamp.fleet.link_server import STOP_GRACE_SECONDS
from aamp.fleet.placement import Need
from aamp.store import time_at
from aamp.store.tables import SandboxRow

LOST_SECONDS = 1.5
FACTS = {
    "drivers": ["gvisor"],
    "cpus": 4,
    "memory_mb": 8192,
    "sandboxes": 16,
    "images": ["base@" + "ab" * 16],
}


@pytest.fixture
async def replicas(tmp_path: Path, postgres_server) -> AsyncIterator[tuple[Plane, Plane]]:  # type: ignore[no-untyped-def]
    async with running_replicas(
        tmp_path,
        postgres_server,
        AAMP_FLEET_HEARTBEAT_SECONDS="0.25",
        AAMP_FLEET_LOST_SECONDS=str(LOST_SECONDS),
    ) as pair:
        yield pair


def _audit(plane: Plane, action: str) -> list[tuple[str, str, str, str]]:
    with plane.cp.store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT actor, resource, decision, reason FROM audit_records"
                " WHERE action = :a ORDER BY seq"
            ),
            {"a": action},
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


async def _add(admin: httpx.AsyncClient, host_id: str) -> str:
    return str((await _added(admin, host_id))["token"])


async def _added(admin: httpx.AsyncClient, host_id: str) -> dict:
    added = await admin.post("/v1/hosts", json={"id": host_id})
    assert added.status_code == 201, added.text
    assert added.json()["host"]["state"] == "new"
    assert added.json()["token"].startswith("aamph_")
    return added.json()


@contextlib.asynccontextmanager
async def _linked(
    plane: Plane, admin: httpx.AsyncClient, host_id: str, tmp: Path
) -> AsyncIterator[tuple[str, ServedLink]]:
    """A host added by `admin`, its token and its link (served here)."""
    added = await _added(admin, host_id)
    async with served_link(tmp / f"link-{host_id}", added, plane.cp.manager) as link:
        yield added["token"], link


@contextlib.asynccontextmanager
async def _registered(
    a: Plane, b: Plane, tmp: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, str, ServedLink]]:
    """An admin on A, a host's side on B, and host h1 registered there through its link."""
    async with (
        a.client(a.admin_token) as admin,
        b.client() as host_side,
        _linked(a, admin, "h1", tmp) as (token, link),
    ):
        assert (await link.register(host_side, token, FACTS)).status_code == 200
        yield admin, host_side, token, link


async def _register(client: httpx.AsyncClient, host_id: str, token: str) -> httpx.Response:
    """A registration naming no link (what a stolen token alone can send)."""
    return await client.post(
        f"/v1/hosts/{host_id}/register", json=FACTS, headers={"x-aamp-host-token": token}
    )


async def _until_lost(
    admin: httpx.AsyncClient, host_id: str, meanwhile: Callable[[], Awaitable[None]] | None = None
) -> float:
    """Seconds from now until the host is marked lost (`meanwhile` runs at each look)."""
    since = time.monotonic()
    while (await _hosts(admin))[host_id]["state"] != "lost":
        assert time.monotonic() - since < LOST_SECONDS + 5, "never marked lost"
        if meanwhile is not None:
            await meanwhile()
        await asyncio.sleep(0.1)
    return time.monotonic() - since


async def _beat(
    client: httpx.AsyncClient, host_id: str, token: str, epoch: int, secret: str | None, **more
) -> httpx.Response:
    body = {"epoch": epoch, **({"secret": secret} if secret is not None else {}), **more}
    return await client.post(
        f"/v1/hosts/{host_id}/heartbeat", json=body, headers={"x-aamp-host-token": token}
    )


async def _hosts(admin: httpx.AsyncClient) -> dict[str, dict]:
    listed = await admin.get("/v1/hosts")
    assert listed.status_code == 200, listed.text
    return {h["id"]: h for h in listed.json()}


async def test_a_host_registers_on_any_replica_only_with_its_own_token(
    replicas: tuple[Plane, Plane], tmp_path: Path
) -> None:
    a, b = replicas
    async with (
        a.client(a.admin_token) as admin_a,
        b.client() as host_side,
        _linked(a, admin_a, "h1", tmp_path) as (token, link),
    ):
        other = await _add(admin_a, "h2")
        for host_id, wrong in (("h1", "aamph_wrong"), ("h1", other), ("nope", token)):
            refused = await _register(host_side, host_id, wrong)
            assert refused.status_code == 401, refused.text
            assert refused.json()["code"] == "host_refused"
            assert "token is not valid" in refused.json()["message"]
        # Refused and recorded, naming the host it claimed; nothing changed.
        denials = _audit(b, "host.refused")
        assert [(d[0], d[2]) for d in denials] == [
            ("host:h1", "deny"),
            ("host:h1", "deny"),
            ("host:nope", "deny"),
        ]
        assert (await _hosts(admin_a))["h1"]["state"] == "new"

        first = await link.register(host_side, token, FACTS)
        assert first.status_code == 200, first.text
        assert first.json()["epoch"] == 1 and first.json()["state"] == "active"
        assert first.json()["lost_after_seconds"] == LOST_SECONDS
        assert first.json()["heartbeat_secret"].startswith("aamphb_")
        shown = (await _hosts(admin_a))["h1"]
        assert shown["drivers"] == ["gvisor"] and shown["cpus"] == 4
        assert shown["sandboxes"] == 16 and shown["images"] == FACTS["images"]
        assert shown["link_address"] == link.address and "heartbeat_secret" not in shown

        # A second registration is a new life; the old epoch's heartbeats are refused.
        second = await link.register(host_side, token, FACTS)
        assert second.json()["epoch"] == 2
        old_secret, new_secret = link.heartbeat_secrets
        assert old_secret != new_secret
        stale = await _beat(host_side, "h1", token, 1, old_secret)
        assert stale.status_code == 409 and stale.json()["code"] == "stale_epoch"
        assert "heartbeats for epoch 1" in _audit(a, "host.refused")[-1][3]
        assert [r[3] for r in _audit(a, "host.registered")] == [
            "registered with its token and its link's proof; epoch 1",
            "registered with its token and its link's proof; epoch 2",
        ]
        beat = await _beat(host_side, "h1", token, 2, new_secret)
        assert beat.status_code == 200 and beat.json()["state"] == "active"
        # Each replica's own host registered on the same path and keeps heartbeating.
        shown = await _hosts(admin_a)
        assert shown["replica-a"]["state"] == shown["replica-b"]["state"] == "active"


async def test_a_silent_host_is_marked_lost_once_and_must_register_again(
    replicas: tuple[Plane, Plane], tmp_path: Path
) -> None:
    a, b = replicas
    async with _registered(a, b, tmp_path) as (admin, host_side, token, link):
        assert await _until_lost(admin, "h1") >= LOST_SECONDS
        await asyncio.sleep(0.6)  # both replicas sweep a few more times
        lost = _audit(a, "host.lost")
        assert [(r[0], r[1]) for r in lost] == [("system", "host:h1")]  # once, by one replica
        assert "lost after 1.5 s" in lost[0][3]
        shown = await _hosts(admin)
        assert shown["replica-a"]["state"] == shown["replica-b"]["state"] == "active"

        late = await _beat(host_side, "h1", token, 1, link.heartbeat_secrets[0])
        assert late.status_code == 409 and "marked lost" in late.json()["message"]
        again = await link.register(host_side, token, FACTS)
        # (its answer also hands the host the installation CA's certificate, public)
        assert again.json()["egress_ca"].startswith("-----BEGIN CERTIFICATE-----")
        blanked = {"heartbeat_seconds": 0, "heartbeat_secret": "", "egress_ca": ""}
        assert again.json() | blanked == {
            "id": "h1",
            "epoch": 2,
            "state": "active",
            "heartbeat_seconds": 0,
            "lost_after_seconds": LOST_SECONDS,
            "heartbeat_secret": "",
            "egress_ca": "",
        }


async def test_drain_and_remove_are_admin_only_and_audited(
    replicas: tuple[Plane, Plane], tmp_path: Path
) -> None:
    a, b = replicas
    op_token = await a.user("olly", "operator")
    async with (
        a.client(a.admin_token) as admin,
        b.client(op_token) as op,
        b.client() as host,
        _linked(a, admin, "h1", tmp_path) as (token, link),
    ):
        assert (await link.register(host, token, FACTS)).status_code == 200
        for call in (op.get("/v1/hosts"), op.post("/v1/hosts/h1/drain"), op.delete("/v1/hosts/h1")):
            assert (await call).status_code == 403
        busy = await admin.delete("/v1/hosts/h1")
        assert busy.status_code == 409 and "drain it first" in busy.json()["message"]
        drained = await admin.post("/v1/hosts/h1/drain")
        assert drained.status_code == 200 and drained.json()["state"] == "draining"
        # A drained host that registers again stays drained.
        assert (await link.register(host, token, FACTS)).json()["state"] == "draining"
        assert (await admin.delete("/v1/hosts/h1")).status_code == 204
        assert "h1" not in await _hosts(admin)
        assert (await link.register(host, token, FACTS)).status_code == 401
    changes = [(r[1], r[2]) for r in _audit(a, "host.drained") + _audit(a, "host.removed")]
    assert changes == [("host:h1", "allow"), ("host:h1", "allow")]


async def test_the_single_host_plane_registers_its_own_host(plane: Plane) -> None:
    assert plane.cp.store.dialect == "sqlite"
    async with plane.client(plane.admin_token) as admin:
        local = (await _hosts(admin))["local"]
    assert local["state"] == "active" and local["epoch"] == 1
    assert local["drivers"] == [DriverDouble.name] and local["sandboxes"] >= 1
    assert local["heartbeat_at"] is not None


async def test_a_refused_own_host_does_not_stop_the_sweep(
    replicas: tuple[Plane, Plane], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    a, b = replicas
    # Only A's tick below sweeps: a sweep of B's (or of A's own timer) at the same moment
    # would lock h1 first, and A's, skipping the locked row, would see it not lost yet.
    for plane in (a, b):
        await plane.cp.fleet.stop()
    # What a second process starting under the same AAMP_FLEET_HOST_ID does: a new token.
    await a.cp.store.run(a.cp.hosts.new_token, "replica-a")
    async with (
        a.client(a.admin_token) as admin,
        _linked(a, admin, "h1", tmp_path) as (token, link),
    ):
        assert (await link.register(admin, token, FACTS)).status_code == 200
    await asyncio.sleep(LOST_SECONDS + 0.1)
    with caplog.at_level(logging.ERROR, logger="aamp.fleet"):
        lost = await a.cp.fleet.tick()  # refused for its own host, and still sweeps
    assert "sandbox host 'replica-a' was refused" in caplog.text
    assert "h1" in [h.id for h in lost]
    assert a.cp.hosts.get("h1").state == "lost"


def _place_old(plane: Plane, host_id: str, sandbox_id: str) -> None:
    """A sandbox placed on the host a minute ago (its reservation and row), as a create
    through the link leaves it."""
    need = Need("gvisor", "base", 1.0, 256)
    placed = plane.cp.manager.placer.placement.place(need, (host_id,))
    with plane.cp.store.write_session() as s:
        s.add(
            SandboxRow(
                id=sandbox_id,
                host_id=host_id,
                host_epoch=placed.epoch,
                state="live",
                millicpus=need.millicpus,
                memory_mb=need.memory_mb,
                created_at=time_at(time.time() - 60),
                expires_at=time_at(time.time() + 600),
            )
        )


def _sandbox_rows(plane: Plane) -> list[str]:
    with plane.cp.store.session() as s:
        return sorted(s.scalars(select(SandboxRow.id)))


async def test_a_stolen_host_token_alone_changes_nothing(
    replicas: tuple[Plane, Plane], tmp_path: Path
) -> None:
    """A token without the host's link key: it cannot register (no link; the real host's
    link, which serves no proof of this registration; a link that does not answer) nor
    heartbeat (no secret; a wrong one), each refused and recorded, the host untouched. The
    answers name the rule only: neither the dial's error nor the current epoch."""
    a, b = replicas
    async with _registered(a, b, tmp_path) as (admin, thief, token, link):
        (secret,) = link.heartbeat_secrets
        _place_old(a, "h1", "sb-old")
        before = (await _hosts(admin))["h1"]
        assert before["used_sandboxes"] == 1 and before["epoch"] == 1

        no_link = await _register(thief, "h1", token)
        assert no_link.status_code == 401 and no_link.json()["code"] == "host_refused"
        assert "must name the host's link" in no_link.json()["message"]

        def attempt(address: str, proof: str | None) -> dict[str, object]:
            return {**FACTS, "link": address, **({"proof": proof} if proof else {})}

        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            nowhere = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
            answers = [
                await thief.post(
                    "/v1/hosts/h1/register", json=body, headers={"x-aamp-host-token": token}
                )
                for body in (
                    attempt(link.address, secrets.token_urlsafe(32)),  # the real host's link
                    attempt(link.address, None),
                    attempt(nowhere, secrets.token_urlsafe(32)),
                )
            ]
        for answer in answers:
            assert answer.status_code == 401 and answer.json()["code"] == "host_refused"
        # One answer for all three, naming neither the address nor what the dial met.
        assert len({answer.json()["message"] for answer in answers}) == 1
        message = answers[0].json()["message"]
        assert "did not prove it is h1" in message and "127.0.0.1" not in message

        no_secret = await _beat(thief, "h1", token, 1, None, sandboxes=[])
        assert no_secret.status_code == 401 and no_secret.json()["code"] == "host_refused"
        assert "must carry the heartbeat secret" in no_secret.json()["message"]
        wrong = "aamphb_" + secrets.token_urlsafe(32)
        forged = [await _beat(thief, "h1", token, e, wrong, sandboxes=[]) for e in (1, 8)]
        for answer in forged:
            assert answer.status_code == 409 and answer.json()["code"] == "stale_epoch"
            assert "current epoch" not in answer.json()["message"]
        # The right epoch and a wrong one answer alike but for the number the caller sent:
        # the answer is no oracle of the current epoch.
        one, eight = (answer.json()["message"] for answer in forged)
        assert one.replace("epoch 1", "epoch N") == eight.replace("epoch 8", "epoch N")

        # Nothing changed: not the epoch, link or heartbeat time, nor the sandbox row.
        assert (await _hosts(admin))["h1"] == before
        assert _sandbox_rows(a) == ["sb-old"]
        refused = _audit(a, "host.refused")
        assert [(r[0], r[2]) for r in refused] == [("host:h1", "deny")] * 7
        reasons = [r[3] for r in refused]
        assert "must name the host's link" in reasons[0]
        assert "serves another proof" in reasons[1] and "no valid proof" in reasons[2]
        assert f"dialling {nowhere}" in reasons[3]  # the detail is the audit's alone
        assert "heartbeat secret" in reasons[4] and "heartbeats for epoch 8" in reasons[6]
        assert len(_audit(a, "host.registered")) == 1
        assert _audit(a, "sandbox.forgotten") == []

        # The host's own heartbeat, reporting nothing, forgets the old row, and says so.
        real = await _beat(thief, "h1", token, 1, secret, sandboxes=[])
        assert real.status_code == 200 and real.json()["unknown"] == []
        assert _sandbox_rows(a) == [] and (await _hosts(admin))["h1"]["used_sandboxes"] == 0
        forgotten = _audit(a, "sandbox.forgotten")
        assert [(r[0], r[1], r[2]) for r in forgotten] == [("host:h1", "sandbox:sb-old", "allow")]
        assert "no longer reports sandbox sb-old" in forgotten[0][3]


async def test_forged_heartbeats_do_not_keep_a_dead_host_alive(
    replicas: tuple[Plane, Plane], tmp_path: Path
) -> None:
    a, b = replicas
    async with _registered(a, b, tmp_path) as (admin, thief, token, _link):
        wrong = "aamphb_" + secrets.token_urlsafe(32)

        async def forge() -> None:  # the host died; someone with its token goes on
            assert (await _beat(thief, "h1", token, 1, wrong)).status_code == 409
            assert (await _beat(thief, "h1", token, 1, None)).status_code == 401

        assert await _until_lost(admin, "h1", forge) >= LOST_SECONDS


async def test_a_hosts_link_stops_within_its_grace_while_a_replica_holds_a_connection(
    replicas: tuple[Plane, Plane], tmp_path: Path
) -> None:
    """A replica keeps its TLS connection to a host's link pooled (registration proved the
    link over it); stopping the link must not wait for that idle peer's TLS close (asyncio
    waits 30 s for it), only for the link's grace."""
    a, b = replicas
    stopping = None
    async with a.client(a.admin_token) as admin, b.client() as host_side:
        async with _linked(a, admin, "h1", tmp_path) as (token, link):
            assert (await link.register(host_side, token, FACTS)).status_code == 200
            await asyncio.sleep(0.5)  # the replicas' collectors reach it too
            stopping = time.monotonic()
        stopped = time.monotonic() - stopping
    assert stopped < STOP_GRACE_SECONDS + 5, stopped
