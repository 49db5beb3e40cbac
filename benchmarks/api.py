"""API latency: p50/p95 of an authorised read under 50 concurrent clients, on SQLite and on
PostgreSQL. Prints a table, writes benchmarks/results/api.json.

    python benchmarks/api.py                 # both backends
    python benchmarks/api.py --requests 40   # per client

The server is a real `aamp up` on loopback. The read is `GET /v1/agents/{id}` by an operator
whose `view` grant allows it: every request authenticates a bearer token, loads the actor's
grants, asks `allowed`, and durably appends the decision to the audit log before answering.
Figures are measured, never asserted.

Each of the 50 clients has its own keep-alive connection and sends its next request when the
previous answer is in (a closed loop, like 50 callers); each opens its connection with one
unmeasured request first. The load generator must not be what is measured: on a 2-core host
an httpx client costs ~1.4 ms of CPU per request (~3 ms with one shared pool of 50
connections), as much as the server, so by default the clients speak HTTP/1.1 over asyncio
streams (`KeepAliveClient`, ~0.1 ms a request); `--client httpx` measures with httpx instead.
The server's CPU time per request is reported too (from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

# The throwaway PostgreSQL server is a test helper, kept with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pgtemp import TemporaryPostgres

RESULTS = Path(__file__).parent / "results" / "api.json"
CLIENTS = 50
# On a shared 2-core host under load, `aamp up` took up to a minute to answer its first
# /v1/health (a CPU-starved start, not a hang); the run then failed before measuring.
START_TIMEOUT_S = 240


class KeepAliveClient:
    """GET requests on one keep-alive HTTP/1.1 connection; answers need a Content-Length."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        lines = "".join(f"{k}: {v}\r\n" for k, v in {"host": host, **headers}.items())
        self._head = lines.encode("latin-1")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> KeepAliveClient:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    async def get(self, path: str) -> tuple[int, bytes]:
        assert self._reader is not None and self._writer is not None
        self._writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\n" + self._head + b"\r\n")
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        length = None
        for line in header_lines:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if length is None:
            raise RuntimeError(f"answer without Content-Length: {status_line}")
        return int(status_line.split()[1]), await self._reader.readexactly(length)


def _server_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(home: Path, database_url: str | None) -> tuple[subprocess.Popen[bytes], str, str]:
    port = _port()
    env = {
        **os.environ,
        "AAMP_HOME": str(home),
        "AAMP_RUNTIME_DIR": f"/run/aamp-b{secrets.token_hex(4)}",
        "AAMP_IMAGE_DIR": str(home / "no-images"),
        "AAMP_PORT": str(port),
        "AAMP_DRIVER": "gvisor",
        "AAMP_ADMIN_PASSWORD": "benchmark-admin-password",
    }
    if database_url:
        env["AAMP_DATABASE_URL"] = database_url
    proc = subprocess.Popen(
        [sys.executable, "-m", "aamp", "up"], env=env, stdout=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("aamp up exited")
        try:
            if httpx.get(f"{base}/v1/health").status_code == 200:
                return proc, base, (home / "cli-token").read_text().strip()
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("aamp up did not start")


async def _measure(
    base: str, admin: str, per_client: int, client_kind: str, server_pid: int
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {admin}"}) as c:
        agent = (await c.post("/v1/agents", json={"name": "bench"})).json()["id"]
        pw = "operator-password-1"
        await c.post("/v1/users", json={"username": "op", "role": "operator", "password": pw})
        await c.post(f"/v1/agents/{agent}/grants", json={"user": "op", "level": "view"})
    async with httpx.AsyncClient(base_url=base) as c:
        login = await c.post("/v1/session", json={"username": "op", "password": pw})
        csrf = login.json()["csrf_token"]
        token = (
            await c.post("/v1/tokens", json={"name": "bench"}, headers={"x-csrf-token": csrf})
        ).json()["token"]
    latencies: list[float] = []
    headers = {"authorization": f"Bearer {token}"}
    path = f"/v1/agents/{agent}"
    host, port = base.removeprefix("http://").split(":")
    start, all_open = asyncio.Event(), asyncio.Event()
    opened = 0

    async def client() -> None:
        if client_kind == "httpx":
            conn: Any = httpx.AsyncClient(base_url=base, headers=headers, timeout=60)
        else:
            conn = KeepAliveClient(host, int(port), headers)
        async with conn:
            get = conn.get
            first = await get(path)  # opens the connection; not measured
            status = first.status_code if client_kind == "httpx" else first[0]
            assert status == 200, first
            nonlocal opened
            opened += 1
            if opened == CLIENTS:
                all_open.set()
            await start.wait()
            for _ in range(per_client):
                t0 = time.perf_counter()
                resp = await get(path)
                latencies.append(time.perf_counter() - t0)
                status = resp.status_code if client_kind == "httpx" else resp[0]
                assert status == 200, resp

    tasks = [asyncio.create_task(client()) for _ in range(CLIENTS)]
    opening = asyncio.create_task(all_open.wait())
    await asyncio.wait([opening, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if not all_open.is_set():  # a client failed before the start: show its error
        await asyncio.gather(*tasks)
    cpu0 = _server_cpu_s(server_pid)
    started = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    cpu = _server_cpu_s(server_pid) - cpu0
    q = statistics.quantiles(latencies, n=100)
    return {
        "requests": len(latencies),
        "clients": CLIENTS,
        "client": client_kind,
        "p50_ms": round(q[49] * 1000, 2),
        "p95_ms": round(q[94] * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "server_cpu_ms_per_request": round(cpu / len(latencies) * 1000, 3),
    }


def run(
    backend: str, per_client: int, pg: TemporaryPostgres | None, client_kind: str
) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="aamp-bench-api-"))
    url = None
    if pg is not None:
        url = pg.create_database(f"bench_{secrets.token_hex(4)}").render_as_string(
            hide_password=False
        )
    proc, base, admin = _start(home, url)
    try:
        measured = _measure(base, admin, per_client, client_kind, proc.pid)
        return {"backend": backend, **asyncio.run(measured)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40, help="requests per client")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw")
    args = parser.parse_args()
    results = [run("sqlite", args.requests, None, args.client)]
    if not args.sqlite_only:
        with TemporaryPostgres() as pg:
            results.append(run("postgresql", args.requests, pg, args.client))
    print(
        f"{'backend':<12}{'requests':>9}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'req/s':>9}"
        f"{'server CPU ms/req':>19}"
    )
    for r in results:
        print(
            f"{r['backend']:<12}{r['requests']:>9}{r['p50_ms']:>9}{r['p95_ms']:>9}"
            f"{r['max_ms']:>9}{r['requests_per_s']:>9}{r['server_cpu_ms_per_request']:>19}"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "read": "GET /v1/agents/{id} by an operator with a view grant (audited)",
                "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
