"""The host registry through the API: two control-plane replicas on one real PostgreSQL, hosts
that register and heartbeat with their own tokens, lost detection by a real timer, drain and
remove; and the single-host SQLite plane registering its own host on the same path."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from api_plane import Plane, running_replicas
from driver_double import DriverDouble
from sqlalchemy import text

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
    added = await admin.post("/v1/hosts", json={"id": host_id})
    assert added.status_code == 201, added.text
    assert added.json()["host"]["state"] == "new"
    token = added.json()["token"]
    assert token.startswith("aamph_")
    return str(token)


async def _register(client: httpx.AsyncClient, host_id: str, token: str) -> httpx.Response:
    return await client.post(
        f"/v1/hosts/{host_id}/register", json=FACTS, headers={"x-aamp-host-token": token}
    )


async def _hosts(admin: httpx.AsyncClient) -> dict[str, dict]:
    listed = await admin.get("/v1/hosts")
    assert listed.status_code == 200, listed.text
    return {h["id"]: h for h in listed.json()}


async def test_a_host_registers_on_any_replica_only_with_its_own_token(
    replicas: tuple[Plane, Plane],
) -> None:
    a, b = replicas
    async with a.client(a.admin_token) as admin_a, b.client() as host_side:
        token = await _add(admin_a, "h1")
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

        first = await _register(host_side, "h1", token)
        assert first.status_code == 200, first.text
        assert first.json()["epoch"] == 1 and first.json()["state"] == "active"
        assert first.json()["lost_after_seconds"] == LOST_SECONDS
        shown = (await _hosts(admin_a))["h1"]
        assert shown["drivers"] == ["gvisor"] and shown["cpus"] == 4
        assert shown["sandboxes"] == 16 and shown["images"] == FACTS["images"]

        # A second registration is a new life; the old epoch's heartbeats are refused.
        second = await _register(host_side, "h1", token)
        assert second.json()["epoch"] == 2
        stale = await host_side.post(
            "/v1/hosts/h1/heartbeat", json={"epoch": 1}, headers={"x-aamp-host-token": token}
        )
        assert stale.status_code == 409 and stale.json()["code"] == "stale_epoch"
        assert "heartbeats for epoch 1" in _audit(a, "host.refused")[-1][3]
        assert [r[3] for r in _audit(a, "host.registered")] == [
            "registered with its token; epoch 1",
            "registered with its token; epoch 2",
        ]
        beat = await host_side.post(
            "/v1/hosts/h1/heartbeat", json={"epoch": 2}, headers={"x-aamp-host-token": token}
        )
        assert beat.status_code == 200 and beat.json()["state"] == "active"
        # Each replica's own host registered on the same path and keeps heartbeating.
        shown = await _hosts(admin_a)
        assert shown["replica-a"]["state"] == shown["replica-b"]["state"] == "active"


async def test_a_silent_host_is_marked_lost_once_and_must_register_again(
    replicas: tuple[Plane, Plane],
) -> None:
    a, b = replicas
    async with a.client(a.admin_token) as admin, b.client() as host_side:
        token = await _add(admin, "h1")
        assert (await _register(host_side, "h1", token)).status_code == 200
        silent_since = time.monotonic()
        while (await _hosts(admin))["h1"]["state"] != "lost":
            assert time.monotonic() - silent_since < LOST_SECONDS + 5, "never marked lost"
            await asyncio.sleep(0.1)
        assert time.monotonic() - silent_since >= LOST_SECONDS
        await asyncio.sleep(0.6)  # both replicas sweep a few more times
        lost = _audit(a, "host.lost")
        assert [(r[0], r[1]) for r in lost] == [("system", "host:h1")]  # once, by one replica
        assert "lost after 1.5 s" in lost[0][3]
        shown = await _hosts(admin)
        assert shown["replica-a"]["state"] == shown["replica-b"]["state"] == "active"

        late = await host_side.post(
            "/v1/hosts/h1/heartbeat", json={"epoch": 1}, headers={"x-aamp-host-token": token}
        )
        assert late.status_code == 409 and "marked lost" in late.json()["message"]
        again = await _register(host_side, "h1", token)
        assert again.json() | {"heartbeat_seconds": 0} == {
            "id": "h1",
            "epoch": 2,
            "state": "active",
            "heartbeat_seconds": 0,
            "lost_after_seconds": LOST_SECONDS,
        }


async def test_drain_and_remove_are_admin_only_and_audited(replicas: tuple[Plane, Plane]) -> None:
    a, b = replicas
    op_token = await a.user("olly", "operator")
    async with a.client(a.admin_token) as admin, b.client(op_token) as op, b.client() as host:
        token = await _add(admin, "h1")
        assert (await _register(host, "h1", token)).status_code == 200
        for call in (op.get("/v1/hosts"), op.post("/v1/hosts/h1/drain"), op.delete("/v1/hosts/h1")):
            assert (await call).status_code == 403
        busy = await admin.delete("/v1/hosts/h1")
        assert busy.status_code == 409 and "drain it first" in busy.json()["message"]
        drained = await admin.post("/v1/hosts/h1/drain")
        assert drained.status_code == 200 and drained.json()["state"] == "draining"
        # A drained host that registers again stays drained.
        assert (await _register(host, "h1", token)).json()["state"] == "draining"
        assert (await admin.delete("/v1/hosts/h1")).status_code == 204
        assert "h1" not in await _hosts(admin)
        assert (await _register(host, "h1", token)).status_code == 401
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
    replicas: tuple[Plane, Plane], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = replicas
    # Only A's tick below sweeps: a sweep of B's (or of A's own timer) at the same moment
    # would lock h1 first, and A's, skipping the locked row, would see it not lost yet.
    for plane in (a, b):
        await plane.cp.fleet.stop()
    # What a second process starting under the same AAMP_FLEET_HOST_ID does: a new token.
    await a.cp.store.run(a.cp.hosts.new_token, "replica-a")
    async with a.client(a.admin_token) as admin:
        token = await _add(admin, "h1")
        assert (await _register(admin, "h1", token)).status_code == 200
    await asyncio.sleep(LOST_SECONDS + 0.1)
    with caplog.at_level(logging.ERROR, logger="aamp.fleet"):
        lost = await a.cp.fleet.tick()  # refused for its own host, and still sweeps
    assert "sandbox host 'replica-a' was refused" in caplog.text
    assert "h1" in [h.id for h in lost]
    assert a.cp.hosts.get("h1").state == "lost"
