"""API latency: p50/p95 of an authorised read under 50 concurrent clients, on SQLite and on
PostgreSQL. Prints a table, writes benchmarks/results/api.json.

    python benchmarks/api.py                 # both backends
    python benchmarks/api.py --requests 40   # per client

The server is a real `aamp up` on loopback. The read is `GET /v1/agents/{id}` by an operator
whose `view` grant allows it: every request authenticates a bearer token, loads the actor's
grants, asks `allowed`, and durably appends the decision to the audit log before answering.
Figures are measured, never asserted.
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

from aamp.store.pgtemp import TemporaryPostgres

RESULTS = Path(__file__).parent / "results" / "api.json"
CLIENTS = 50


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
    deadline = time.monotonic() + 60
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


async def _measure(base: str, admin: str, per_client: int) -> dict[str, Any]:
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
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(
        base_url=base, headers={"authorization": f"Bearer {token}"}, limits=limits, timeout=60
    ) as c:
        for _ in range(3):  # warm up
            assert (await c.get(f"/v1/agents/{agent}")).status_code == 200

        async def client() -> None:
            for _ in range(per_client):
                t0 = time.perf_counter()
                resp = await c.get(f"/v1/agents/{agent}")
                latencies.append(time.perf_counter() - t0)
                assert resp.status_code == 200, resp.text

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        elapsed = time.perf_counter() - started
    q = statistics.quantiles(latencies, n=100)
    return {
        "requests": len(latencies),
        "clients": CLIENTS,
        "p50_ms": round(q[49] * 1000, 2),
        "p95_ms": round(q[94] * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2),
        "requests_per_s": round(len(latencies) / elapsed, 1),
    }


def run(backend: str, per_client: int, pg: TemporaryPostgres | None) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="aamp-bench-api-"))
    url = None
    if pg is not None:
        url = pg.create_database(f"bench_{secrets.token_hex(4)}").render_as_string(
            hide_password=False
        )
    proc, base, admin = _start(home, url)
    try:
        return {"backend": backend, **asyncio.run(_measure(base, admin, per_client))}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40, help="requests per client")
    parser.add_argument("--sqlite-only", action="store_true")
    args = parser.parse_args()
    results = [run("sqlite", args.requests, None)]
    if not args.sqlite_only:
        with TemporaryPostgres() as pg:
            results.append(run("postgresql", args.requests, pg))
    print(f"{'backend':<12}{'requests':>9}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'req/s':>9}")
    for r in results:
        print(
            f"{r['backend']:<12}{r['requests']:>9}{r['p50_ms']:>9}{r['p95_ms']:>9}"
            f"{r['max_ms']:>9}{r['requests_per_s']:>9}"
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
