"""A sandbox with packages on sandbox hosts on other machines: a real replica (its own host
drained, so every sandbox goes over the link) and two real `aamp host serve` processes, each
with its own image directory, on real PostgreSQL and gVisor, loopback only.

- a create whose policy lists a package from the replica's wheelhouse lands on a remote
  host, which was sent the wheel by SHA-256 (kept in its `link-wheels/`), built the packages
  layer itself and reports it in its heartbeat (`base+KEY@HASH`); the package imports in the
  sandbox;
- a second create with the same packages goes to the host that has the layer although the
  other has more free slots, and reuses it: no wheel sent again, no layer built again; the
  other host was never sent anything;
- a wheelhouse file whose bytes are not the SHA-256 its index records (tampered with on
  disk) is refused by the host, recorded as its refusal (`host.packages_refused`), the create
  answers 400 saying so and nothing is reserved; a wheel announced over the size bound is
  refused by the host (413) before a byte of it is read, and logged there.
"""

from __future__ import annotations

import hashlib
import secrets
import socket
import sys
import time
from pathlib import Path

import httpx
from fleet_processes import exec_in, fleet_on_postgres, host_state, wait_for

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from wheel_files import linked_image_dir, make_wheel  # noqa: E402  (tests/wheel_files.py)

from aamp.config import Settings  # noqa: E402
from aamp.fleet.link_ca import LinkCA, link_name  # noqa: E402
from aamp.sandbox.image_derive import packages_key  # noqa: E402
from aamp.sandbox.wheelhouse import MAX_WHEEL_BYTES  # noqa: E402

HEARTBEAT, LOST = "1", "4"


def _upload(admin: httpx.Client, wheel: Path) -> dict:
    r = admin.put(f"/v1/wheelhouse/wheels/{wheel.name}", content=wheel.read_bytes())
    assert r.status_code == 201, r.text
    return r.json()[0]


def _policy(name: str, packages: list[str]) -> dict:
    listed = ", ".join(packages)
    return {"policy_document": f"name: {name}\nimage: base\npackages: [{listed}]\n"}


def _create(api: httpx.Client, body: dict) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = api.post("/v1/sandboxes", json=body)
    return r, time.monotonic() - started


def _layers(images: Path) -> list[Path]:
    base = images / "base"
    current = (base / "current").readlink().name
    return sorted(p for p in base.iterdir() if len(p.name) == 64 and p.name != current)


def _announce_too_large(port: int, host_id: str, home: Path, sha: str, filename: str) -> bytes:
    """A PUT of a wheel announced one byte over the bound, as a replica (its certificate):
    the host's answer, read before any body is sent."""
    tls = LinkCA.of(Settings.from_env({"AAMP_HOME": str(home)})).replica_context()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        tls.wrap_socket(raw, server_hostname=link_name(host_id)) as conn,
    ):
        conn.sendall(
            f"PUT /link/wheels/{sha}?filename={filename} HTTP/1.1\r\nhost: {host_id}\r\n"
            f"content-length: {MAX_WHEEL_BYTES + 1}\r\n\r\n".encode()
        )
        answer = b""
        while b"}" not in answer:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


def test_packages_on_remote_hosts(tmp_path: Path, base_image, postgres_server) -> None:
    fleet = fleet_on_postgres(tmp_path, postgres_server, HEARTBEAT, LOST)
    tag = secrets.token_hex(4)  # a layer no earlier run built
    good = make_wheel(tmp_path, "aamprpkg", f"1.0+t{tag}", "X = 'from the wheel'\n")
    left: list[int] = []
    try:
        api = fleet.replica("rep")
        assert api.post("/v1/hosts/rep/drain").status_code == 200
        hosts = {h: fleet.add_host(api, h) for h in ("h1", "h2")}
        images = {h: linked_image_dir(tmp_path / f"img-{h}", base_image) for h in hosts}
        for h, host in hosts.items():
            host.start(AAMP_IMAGE_DIR=str(images[h]))
        for h in hosts:
            wait_for(lambda h=h: host_state(api, h)["state"] == "active", 120)
        wheel = _upload(api, good)
        key = packages_key([wheel["sha256"]])

        # -- the first create: the wheel is sent, the layer built on the host -----------
        body = _policy("pk", [f"aamprpkg==1.0+t{tag}"])
        first, first_seconds = _create(api, body)
        assert first.status_code == 201, first.text
        one = first.json()
        on, other = one["host"], ({"h1", "h2"} - {one["host"]}).pop()
        assert one["packages"] == [f"aamprpkg==1.0+t{tag}"]
        code, out = exec_in(api, one["id"], "python3 -c 'import aamprpkg; print(aamprpkg.X)'")
        assert (code, out) == (0, b"from the wheel\n")
        sent = hosts[on].home / "link-wheels" / wheel["sha256"] / good.name
        assert sent.read_bytes() == good.read_bytes()
        kept_at = sent.stat().st_mtime_ns
        assert len(_layers(images[on])) == 1 and _layers(images[other]) == []
        wait_for(lambda: any(i.startswith(f"base+{key}@") for i in host_state(api, on)["images"]))

        # -- the second: to the host with the layer (the other has more free slots) ------
        second, second_seconds = _create(api, body)
        assert second.status_code == 201, second.text
        two = second.json()
        assert two["host"] == on, (two, host_state(api, on), host_state(api, other))
        code, out = exec_in(api, two["id"], "python3 -c 'import aamprpkg; print(aamprpkg.X)'")
        assert (code, out) == (0, b"from the wheel\n")
        assert sent.stat().st_mtime_ns == kept_at  # not sent again
        assert len(_layers(images[on])) == 1  # not built again
        assert not (hosts[other].home / "link-wheels").exists()
        print(f"\nfirst create with packages {first_seconds:.2f} s, second {second_seconds:.2f} s")
        for s in (one, two):
            assert api.delete(f"/v1/sandboxes/{s['id']}").status_code == 204

        # -- a wheelhouse file that is not what its index says: refused and recorded -----
        bad = make_wheel(tmp_path, "aamprbad", "1.0", "X = 1\n")
        bad_entry = _upload(api, bad)
        (tmp_path / "swap").mkdir()
        swapped = make_wheel(tmp_path / "swap", "aamprbad", "1.0", "X = 'tampered'\n")
        (fleet.home / "wheelhouse" / bad.name).write_bytes(swapped.read_bytes())
        refused, _ = _create(api, _policy("bad", ["aamprbad==1.0"]))
        assert refused.status_code == 400, refused.text
        message = refused.json()["message"]
        assert "refused the packages" in message and "not the SHA-256" in message, message
        records = api.get("/v1/audit", params={"action": "host.packages_refused"}).json()
        [record] = records["records"]
        assert record["decision"] == "deny" and record["actor"].startswith("host:h")
        assert bad_entry["sha256"] in record["reason"]
        assert all(host_state(api, h)["used_sandboxes"] == 0 for h in hosts)
        for host in hosts.values():
            assert not (host.home / "link-wheels" / bad_entry["sha256"]).exists()

        # -- a wheel announced over the bound: refused before it is read ----------------
        digest = hashlib.sha256(b"x").hexdigest()
        answer = _announce_too_large(hosts[other].port, other, fleet.home, digest, bad.name)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        assert b"wheel_refused" in answer, answer
        assert not (hosts[other].home / "link-wheels" / digest).exists()
        assert "a wheel was refused" in hosts[other].log.read_text()
        assert api.get("/v1/audit/verify").json()["ok"] is True
    finally:
        left = fleet.close()
    assert left == []
