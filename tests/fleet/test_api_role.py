"""`aamp up --role api`: a control-plane replica that runs no sandbox of its own, started as
an operator starts it (`python -m aamp up --role api`), with a real `aamp host serve` process,
real PostgreSQL and gVisor, loopback only.

- on SQLite it refuses to start, saying a replica needs PostgreSQL;
- with no host registered, a sandbox create answers 503 `no_capacity` saying no host is
  available, and the replica registers no host of its own;
- with a host, create, exec and destroy through the replica land on that host; the host
  honours the same warm-pool setting `aamp up` reads (`AAMP_WARM_POOL`: the sandbox is
  handed out warm), and a warm pool on the replica itself is refused at start;
- a create whose packages the replica's wheelhouse lacks is refused there, naming them.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx
from fleet_processes import (
    HostProcess,
    exec_in,
    fleet_on_postgres,
    free_port,
    host_state,
    up_api,
    wait_for,
)

HEARTBEAT, LOST = "1", "4"


def _up_api(home: Path, port: int, **env: str) -> subprocess.Popen[bytes]:
    return up_api(
        home, port, AAMP_FLEET_HEARTBEAT_SECONDS=HEARTBEAT, AAMP_FLEET_LOST_SECONDS=LOST, **env
    )


def test_role_api_on_sqlite_is_refused_at_start(tmp_path: Path) -> None:
    proc = _up_api(tmp_path / "home", free_port())
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert b"--role api needs PostgreSQL" in out, out.decode()


def test_role_api_with_a_warm_pool_is_refused_at_start(tmp_path: Path, postgres_server) -> None:
    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")
    proc = _up_api(
        tmp_path / "home",
        free_port(),
        AAMP_DATABASE_URL=url.render_as_string(hide_password=False),
        AAMP_WARM_POOL="base=1",
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert b"AAMP_WARM_POOL and AAMP_WARM_POOL_LEARN are a sandbox host's settings" in out


def _settled(host: HostProcess) -> int:
    """How many sandbox processes the host runs, once that number holds for two seconds."""
    while True:
        wait_for(lambda: len(host.sandbox_pids()) > 0, 120)
        count = len(host.sandbox_pids())
        time.sleep(2)
        if len(host.sandbox_pids()) == count:
            return count


def test_role_api_places_every_sandbox_on_a_registered_host(
    tmp_path: Path, base_image, postgres_server
) -> None:
    fleet = fleet_on_postgres(tmp_path, postgres_server, HEARTBEAT, LOST)
    port = free_port()
    replica = _up_api(fleet.home, port, AAMP_DATABASE_URL=fleet.env["AAMP_DATABASE_URL"])
    fleet.replicas.append((replica, str(tmp_path / "no-runtime"), port))
    left: list[int] = []
    try:

        def up() -> bool:
            assert replica.poll() is None, replica.stdout.read().decode()  # type: ignore[union-attr]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v1/health").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 120)
        token = (fleet.home / "cli-token").read_text().strip()
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"authorization": f"Bearer {token}"},
            timeout=120,
        )
        assert api.get("/v1/health").json()["drivers"] == []

        # -- no host yet: a clear 503, and no host of its own ----------------------------
        r = api.post("/v1/sandboxes", json={"image": "base"})
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "no_capacity"
        assert "no sandbox host is available" in r.json()["message"]
        assert api.get("/v1/hosts").json() == []

        # -- a host: every sandbox lands there -------------------------------------------
        host = fleet.add_host(api, "h1")
        host.start(AAMP_WARM_POOL="base=1")
        wait_for(lambda: host_state(api, "h1")["state"] == "active", 120)
        one = _settled(host)  # its warm pool has filled: one sandbox's processes
        made = api.post("/v1/sandboxes", json={"image": "base", "ttl_seconds": 600})
        assert made.status_code == 201, made.text
        sandbox = made.json()
        assert sandbox["host"] == "h1" and sandbox["warm"] is True, sandbox
        # The pool refills behind it; a host stopped while a boot is half-way can leave that
        # boot's processes (noted in the report), so the test lets it finish first.
        wait_for(lambda: _settled(host) == 2 * one, 120)
        assert exec_in(api, sandbox["id"], "echo $((6*7))") == (0, b"42\n")
        assert api.get(f"/v1/sandboxes/{sandbox['id']}").json()["host"] == "h1"
        assert host_state(api, "h1")["used_sandboxes"] == 1
        assert api.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        assert api.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 404
        assert host_state(api, "h1")["used_sandboxes"] == 0

        # -- egress rules travel with the create; what a remote host cannot take yet says so --
        inline = {"policy_document": "name: wide\nimage: base\negress: {default: allow}\n"}
        r = api.post("/v1/sandboxes", json=inline)
        assert r.status_code == 201, r.text
        assert r.json()["host"] == "h1"
        assert api.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
        asking = {"policy_document": "name: asks\nimage: base\negress: {default: ask}\n"}
        r = api.post("/v1/sandboxes", json=asking)  # its questions come back over the link
        assert r.status_code == 201, r.text
        assert r.json()["host"] == "h1"
        assert api.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
        # Packages travel too (`test_remote_packages.py`): ones the replica's wheelhouse
        # lacks are refused there, before anything is reserved.
        packages = {"policy_document": "name: pk\nimage: base\npackages: [tabulate==0.9.0]\n"}
        r = api.post("/v1/sandboxes", json=packages)
        assert r.status_code == 400, r.text
        assert "tabulate==0.9.0 is not in the wheelhouse" in r.json()["message"]
        assert host_state(api, "h1")["used_sandboxes"] == 0

        # -- SIGTERM: the replica stops cleanly (uvicorn exits by the signal it caught) --
        replica.send_signal(signal.SIGTERM)
        assert replica.wait(timeout=60) in (0, -signal.SIGTERM)
        said = replica.stdout.read().decode()  # type: ignore[union-attr]
        assert "role api: every sandbox on a registered host" in said
        assert "Traceback" not in said, said
    finally:
        left = fleet.close()
    assert left == []
