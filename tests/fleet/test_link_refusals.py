"""The link between replicas and sandbox hosts, attacked from the untrusted side: real
`aamp host serve` processes and a real replica on one real PostgreSQL, loopback only.

- a host presenting someone else's link certificate, or one from another CA, cannot
  register (refused at the link check, recorded as `host.refused`, nothing changed);
- a host claiming another host's id with that host's (stolen, replayed) token but its own
  link is refused, and the real host's life goes on untouched;
- that token alone cannot register without a link, nor with the real host's link (which
  serves only the proof of its own registration in flight), nor heartbeat without the
  secret of the real host's registration: each refused and recorded, the epoch never told,
  and the real host's life and sandbox go on;
- a host's certificate, a foreign CA's, or none at all cannot open another host's link as a
  replica (the TLS handshake refuses it); a replica's placement for an earlier life of the
  host (a stale epoch) boots nothing;
- a host reporting sandboxes it does not run is refused (recorded), and nothing changes.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import ssl
import time
import uuid
from pathlib import Path

import httpx
import pytest
from fleet_processes import Fleet, host_state, wait_for, write_credentials
from served_link import served_link

from aamp.config import Settings
from aamp.fleet.link_ca import LinkCA, link_name

TOKEN = "X-Aamp-Host-Token"


def _records(admin: httpx.Client, action: str) -> list[dict]:
    return admin.get("/v1/audit", params={"action": action}).json()["records"]


def _link(host_port: int, host_id: str, ca: Path, client: tuple[Path, Path] | None) -> int:
    """Status of GET /link/hello on a host's link with `client`'s certificate; 0 when the TLS
    handshake refused the connection."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    if client is not None:
        ctx.load_cert_chain(*client)
    try:
        with httpx.Client(verify=ctx, timeout=10) as client_:
            r = client_.get(
                f"https://127.0.0.1:{host_port}/link/hello",
                extensions={"sni_hostname": link_name(host_id)},
            )
    except httpx.HTTPError:
        return 0
    return r.status_code


def test_the_link_refuses_what_cannot_prove_itself(
    tmp_path: Path, base_image, postgres_server
) -> None:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("sandbox hosts need root and runsc here")
    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")
    fleet = Fleet(tmp_path, url.render_as_string(hide_password=False), "1", "4")
    left: list[int] = []
    try:
        a = fleet.replica("rep-a")
        assert a.post("/v1/hosts/rep-a/drain").status_code == 200
        h1, h2 = fleet.add_host(a, "h1"), fleet.add_host(a, "h2")
        h1.start()
        wait_for(lambda: host_state(a, "h1")["state"] == "active", 120)
        sandbox = a.post("/v1/sandboxes", json={"image": "base"}).json()
        assert sandbox["host"] == "h1"
        h1_epoch = host_state(a, "h1")["epoch"]

        # -- someone else's certificate, and a foreign CA's ------------------------------
        h1_cert = (h1.cert_dir / "host.crt").read_bytes(), (h1.cert_dir / "host.key").read_bytes()
        foreign_ca = LinkCA.of(Settings.from_env({"AAMP_HOME": str(tmp_path / "foreign")}))
        foreign_cert = foreign_ca.issue_host("h2")
        for cert, key in (h1_cert, foreign_cert):
            (h2.cert_dir / "host.crt").write_bytes(cert)
            (h2.cert_dir / "host.key").write_bytes(key)
            proc = h2.start()
            assert proc.wait(timeout=120) != 0  # it cannot register, so it does not serve
            assert "refused host h2's registration (401)" in h2.log.read_text()
        refused = [r for r in _records(a, "host.refused") if r["actor"] == "host:h2"]
        assert len(refused) == 2 and all(r["decision"] == "deny" for r in refused)
        assert all("did not prove it is h2" in r["reason"] for r in refused)
        assert host_state(a, "h2")["state"] == "new" and host_state(a, "h2")["epoch"] == 0

        # -- a wrong token never makes the replica dial the link it names ----------------
        with socket.socket() as trap:
            trap.bind(("127.0.0.1", 0))
            trap.listen()
            trap.settimeout(1.0)
            wrong = httpx.post(
                f"{str(a.base_url).rstrip('/')}/v1/hosts/h2/register",
                json={
                    "drivers": ["gvisor"],
                    "cpus": 1,
                    "memory_mb": 512,
                    "sandboxes": 1,
                    "link": f"127.0.0.1:{trap.getsockname()[1]}",
                },
                headers={TOKEN: "aamph_wrong"},
            )
            assert wrong.status_code == 401 and "token is not valid" in wrong.text
            with pytest.raises(TimeoutError):
                trap.accept()

        # -- another host's id with its token, but not its link --------------------------
        stolen = (h1.cert_dir / "host.token").read_text()
        h2_own = write_credentials(
            tmp_path / "h2-real", a.post("/v1/hosts", json={"id": "h2b"}).json()
        )
        impostor = fleet.add_host(a, "h3")  # a process of its own, with h2b's real link
        for name in ("host.crt", "host.key", "ca.crt"):
            (impostor.cert_dir / name).write_bytes((h2_own / name).read_bytes())
        (impostor.cert_dir / "host.token").write_text(stolen)
        proc = impostor.start(claim_id="h1")
        assert proc.wait(timeout=120) != 0
        claimed = [r for r in _records(a, "host.refused") if r["actor"] == "host:h1"]
        assert claimed and "did not prove it is h1" in claimed[-1]["reason"]
        assert host_state(a, "h1")["epoch"] == h1_epoch  # its life goes on, untouched
        assert host_state(a, "h1")["link_address"] == f"127.0.0.1:{h1.port}"

        # -- h1's stolen token alone, without h1's link key ------------------------------
        def as_h1(call: str, body: dict) -> httpx.Response:
            return httpx.post(
                f"{str(a.base_url).rstrip('/')}/v1/hosts/h1/{call}",
                json=body,
                headers={TOKEN: stolen},
            )

        seen = len([r for r in _records(a, "host.refused") if r["actor"] == "host:h1"])
        for forged_secret in (None, "aamphb_" + secrets.token_urlsafe(32)):
            beat = {"epoch": h1_epoch, "sandboxes": []}
            forged = as_h1("heartbeat", beat | ({"secret": forged_secret} if forged_secret else {}))
            assert forged.status_code in (401, 409), forged.text  # refused: nothing settled
            assert "current epoch" not in forged.text  # nor the epoch told
        facts = {"drivers": ["gvisor"], "cpus": 1, "memory_mb": 512, "sandboxes": 1}
        no_link = as_h1("register", facts)
        assert no_link.status_code == 401 and "must name the host's link" in no_link.text
        at_h1 = as_h1(  # h1's real link, which serves only its own registrations' proofs
            "register",
            facts | {"link": f"127.0.0.1:{h1.port}", "proof": secrets.token_urlsafe(32)},
        )
        assert at_h1.status_code == 401 and "did not prove it is h1" in at_h1.text
        claimed = [r for r in _records(a, "host.refused") if r["actor"] == "host:h1"]
        assert len(claimed) == seen + 4 and all(r["decision"] == "deny" for r in claimed)
        assert "serves another proof" in claimed[-1]["reason"]
        time.sleep(3)  # three of h1's heartbeats: they go on under its untouched life
        assert host_state(a, "h1")["epoch"] == h1_epoch
        assert host_state(a, "h1")["used_sandboxes"] == 1
        ran = a.post(f"/v1/sandboxes/{sandbox['id']}/exec", json={"argv": ["true"]})
        assert ran.status_code == 200 and '"exit_code":0' in ran.text

        # -- only a replica's certificate opens a host's link ----------------------------
        ca = h1.cert_dir / "ca.crt"
        own = (h2.cert_dir / "own.crt", h2.cert_dir / "own.key")
        for path, pem in zip(own, foreign_cert, strict=True):
            path.write_bytes(pem)
        h2b_pair = (h2_own / "host.crt", h2_own / "host.key")
        assert _link(h1.port, "h1", ca, h2b_pair) == 0  # a host's certificate is no client's
        assert _link(h1.port, "h1", ca, own) == 0  # another CA's
        assert _link(h1.port, "h1", ca, None) == 0  # none at all
        replica_ca = LinkCA.of(Settings.from_env({"AAMP_HOME": str(fleet.home)}))
        as_replica = replica_ca.replica_context()
        link = httpx.Client(base_url=f"https://127.0.0.1:{h1.port}", verify=as_replica)
        sni = {"sni_hostname": link_name("h1")}
        assert link.get("/link/hello", extensions=sni).json()["id"] == "h1"
        # ... and a placement for an earlier life of the host boots nothing.
        before = len(h1.sandbox_pids())
        stale = link.post(
            "/link/sandboxes",
            json={"image": "base", "ttl": 60, "idle": 60, "epoch": h1_epoch - 1},
            extensions=sni,
        )
        assert stale.status_code == 409 and stale.json()["code"] == "stale_epoch"
        assert len(h1.sandbox_pids()) == before
        assert len(link.get("/link/sandboxes", extensions=sni).json()) == 1
        link.close()
        # The replica checks the host's name: h1's link is not h2's (a new connection: one
        # that is open already was checked when it opened).
        with httpx.Client(verify=as_replica) as fresh, pytest.raises(httpx.ConnectError):
            fresh.get(
                f"https://127.0.0.1:{h1.port}/link/hello",
                extensions={"sni_hostname": link_name("h2")},
            )

        # -- a host reporting sandboxes it does not run ----------------------------------
        async def lie() -> httpx.Response:
            """Host h4 (its link served here, running nothing) reports h1's sandbox."""
            added = a.post("/v1/hosts", json={"id": "h4"}).json()
            token = added["token"]
            async with (
                served_link(tmp_path / "h4-link", added) as h4,
                httpx.AsyncClient(base_url=str(a.base_url)) as host_side,
            ):
                assert (await h4.register(host_side, token, facts)).status_code == 200
                return await host_side.post(
                    "/v1/hosts/h4/heartbeat",
                    json={
                        "epoch": host_state(a, "h4")["epoch"],
                        "secret": h4.heartbeat_secrets[0],
                        "sandboxes": [sandbox["id"]],
                    },
                    headers={TOKEN: token},
                )

        lie = asyncio.run(lie())
        assert lie.status_code == 200 and lie.json()["unknown"] == [], lie.text
        lies = _records(a, "host.report_refused")
        assert len(lies) == 1 and lies[0]["actor"] == "host:h4"
        assert sandbox["id"] in lies[0]["reason"] and lies[0]["decision"] == "deny"
        assert a.get(f"/v1/sandboxes/{sandbox['id']}").json()["host"] == "h1"  # unchanged
        assert host_state(a, "h1")["used_sandboxes"] == 1

        assert a.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        verified = a.get("/v1/audit/verify").json()
        assert verified["ok"], verified
    finally:
        left = fleet.close()
    assert left == []
