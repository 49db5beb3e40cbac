"""Real fleet processes on this machine, for the remote-host tests and `benchmarks/fleet.py`:
control-plane replicas (`serve_runs_plane.py`, sharing one home and one PostgreSQL database)
and sandbox hosts (`python -m aamp host serve`, each with its own home, runtime directory and
link port on loopback, the built images shared)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "runs")]

from install_layout import shared_image_dir  # noqa: E402  (tests/install_layout.py)
from run_helpers import serve_plane  # noqa: E402

from aamp.sandbox import procs  # noqa: E402

CREDENTIALS = {"host.token": "token", "host.crt": "link_cert", "host.key": "link_key",
               "ca.crt": "link_ca"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_credentials(directory: Path, added: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, key in CREDENTIALS.items():
        (directory / name).write_text(added[key])
        os.chmod(directory / name, 0o600)
    return directory


@dataclass
class HostProcess:
    host_id: str
    cert_dir: Path
    home: Path
    runtime: str
    port: int
    control_plane: str
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.home.with_suffix(".log")

    def start(self, claim_id: str | None = None, **settings: str) -> subprocess.Popen[bytes]:
        """`aamp host serve` as a child process (`claim_id`: the id it says it is;
        `settings`: more AAMP_* settings of the host)."""
        self.home.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "AAMP_HOME": str(self.home),
            "AAMP_RUNTIME_DIR": self.runtime,
            "AAMP_IMAGE_DIR": str(shared_image_dir()),
            "AAMP_FLEET_HOST_ID": claim_id or self.host_id,
            **settings,
        }
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "aamp",
                    "host",
                    "serve",
                    "--control-plane",
                    self.control_plane,
                    "--cert-dir",
                    str(self.cert_dir),
                    "--listen",
                    f"127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        return self.proc

    def sandbox_pids(self) -> list[int]:
        return procs.pids_matching(f"--root={self.runtime}/runsc")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.runtime, ignore_errors=True)


def up_api(
    home: Path, port: int, out: int | IO[bytes] = subprocess.PIPE, **env: str
) -> subprocess.Popen[bytes]:
    """`python -m aamp up --role api` as an operator starts it, its output to `out`; `env`
    adds settings (the AAMP_* settings of this process are not passed on)."""
    return subprocess.Popen(
        [sys.executable, "-m", "aamp", "up", "--role", "api"],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("AAMP_")},
            "AAMP_HOME": str(home),
            "AAMP_HOST": "127.0.0.1",
            "AAMP_PORT": str(port),
            "AAMP_ADMIN_PASSWORD": "admin-password-for-tests",
            **env,
        },
    )


def wait_for(predicate, timeout: float = 60.0, every: float = 0.1) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)


def host_state(admin: httpx.Client, host_id: str) -> dict:
    return next(h for h in admin.get("/v1/hosts").json() if h["id"] == host_id)


def fleet_on_postgres(root: Path, postgres_server, heartbeat: str, lost: str) -> Fleet:  # type: ignore[no-untyped-def]
    """A fleet on a fresh database of the tests' PostgreSQL server (skipped without root
    and runsc, which sandbox hosts need)."""
    import uuid

    import pytest

    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("sandbox hosts need root and runsc here")
    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")
    return Fleet(root, url.render_as_string(hide_password=False), heartbeat, lost)


def exec_in(client: httpx.Client, sandbox_id: str, script: str) -> tuple[int, bytes]:
    """`sh -c script` in the sandbox through `client`: exit code and stdout."""
    import base64
    import json

    r = client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"argv": ["sh", "-c", script]})
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines()]
    out = b"".join(base64.b64decode(x["data"]) for x in lines if x.get("stream") == "stdout")
    return lines[-1]["exit_code"], out


class Fleet:
    """Replicas and hosts of one installation; `close` stops them all."""

    def __init__(self, root: Path, database_url: str, heartbeat: str, lost: str) -> None:
        self.root = root
        self.home = root / "home"  # the replicas' shared home: vault, audit and link CA keys
        self.env = {
            "AAMP_DATABASE_URL": database_url,
            "AAMP_FLEET_HEARTBEAT_SECONDS": heartbeat,
            "AAMP_FLEET_LOST_SECONDS": lost,
        }
        self.replicas: list[tuple[subprocess.Popen[bytes], str, int]] = []
        self.hosts: dict[str, HostProcess] = {}

    def replica(self, host_id: str, **env: str) -> httpx.Client:
        """A replica whose own host is `host_id`; `env` adds settings."""
        runtime, port = f"/run/aamp-t{secrets.token_hex(4)}", free_port()
        proc = serve_plane(self.home, runtime, port, AAMP_FLEET_HOST_ID=host_id, **self.env, **env)
        self.replicas.append((proc, runtime, port))
        token = (self.home / "cli-token").read_text().strip()
        return httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"authorization": f"Bearer {token}"},
            timeout=120,
        )

    def add_host(self, admin: httpx.Client, host_id: str) -> HostProcess:
        added = admin.post("/v1/hosts", json={"id": host_id})
        assert added.status_code == 201, added.text
        cert_dir = write_credentials(self.root / f"creds-{host_id}", added.json())
        host = HostProcess(
            host_id,
            cert_dir,
            self.root / f"host-{host_id}",
            f"/run/aamp-t{secrets.token_hex(4)}",
            free_port(),
            str(admin.base_url).rstrip("/"),
        )
        self.hosts[host_id] = host
        return host

    def close(self) -> list[int]:
        """Stop everything; the sandbox processes any of it left behind."""
        for host in self.hosts.values():
            host.stop()
        for proc, _, _ in self.replicas:
            proc.kill()
            proc.wait()
        left = [p for h in self.hosts.values() for p in h.sandbox_pids()]
        for _, runtime, _ in self.replicas:
            left += procs.pids_matching(f"--root={runtime}/runsc")
            shutil.rmtree(runtime, ignore_errors=True)
        return left
