"""Server time of the UI's list pages over a large installation: the run history with
100,000 runs and the audit log with 1,000,000 records (SQLite); and how soon a run's first
step reaches a browser following the live run view after it is stored. Prints a table
(median and p95 of each), writes benchmarks/results/ui.json.

    python benchmarks/ui.py                        # 100,000 runs, 1,000,000 audit records
    python benchmarks/ui.py --runs 5000 --records 50000 --samples 20

The control plane is real (store, audit log, identity, the API and the UI) and boots no
sandbox (tests/driver_double.py's DriverDouble). Audit records are appended through the real
audit log (hash-chained, group-committed), so the chain is a real one; runs are rows written
straight to the runs table (a run's own steps do not matter to the list). A page is timed from
the request entering the site to its last byte, in the same process (the ASGI app called
directly): the server's time without a network. Each page is a whole UI page: `/v1/me`, the
list call the page makes, rendering — and the audit records of those calls. Figures are
measured, never asserted.

The live view's latency is timed over a real loopback connection (the site served by
uvicorn, an HTTP client reading `/runs/ID/stream` as the browser's EventSource does): a
fresh run, its view open and waiting, then its first step written through the run service's
own `emit` (audited, stored, announced, as a run's executor writes it). The latency is from
the step's stored time (`run_events.at`) to the client holding the step's HTML fragment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import secrets
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "api")]
from api_plane import ADMIN_PASSWORD, plane_settings, running_plane  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from aamp.runs.store import RunStore  # noqa: E402
from aamp.store.tables import RunRow  # noqa: E402
from aamp.store.timestamps import parse_time  # noqa: E402
from aamp.web import site_of  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "ui.json"
STATUSES = ("succeeded", "failed", "cancelled", "timed_out")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _fill_audit(cp: Any, records: int) -> float:
    started = time.perf_counter()
    batch = 2000
    for start in range(0, records, batch):
        await asyncio.gather(
            *[
                cp.audit.record(
                    actor=f"user:u{i % 50}",
                    action="sandbox.exec",
                    resource=f"sandbox:sb-{i % 4096:012x}",
                    decision="allow" if i % 10 else "deny",
                    reason="grant run on agent finance-reports",
                    request_id=f"req-{i}",
                    details={"argv": ["python", "report.py"], "exit": 0},
                )
                for i in range(start, min(records, start + batch))
            ]
        )
    return time.perf_counter() - started


def _fill_runs(cp: Any, agents: list[str], runs: int) -> None:
    rows = [
        {
            "id": f"run-{i:012x}",
            "agent_id": agents[i % len(agents)],
            "version": 1,
            "owner": f"u{i % 50}",
            "task": f"monthly report {i}",
            "status": STATUSES[i % len(STATUSES)],
            "steps": 3,
            "prompt_tokens": 100,
            "completion_tokens": 20,
            "created_at": f"2026-01-01T00:00:00.{i:06d}Z"[:32],
        }
        for i in range(runs)
    ]
    with cp.store.engine.begin() as conn:
        for start in range(0, len(rows), 10_000):
            conn.execute(insert(RunRow), rows[start : start + 10_000])


async def _time(client: httpx.AsyncClient, path: str, samples: int) -> dict[str, float]:
    await client.get(path)  # unmeasured
    took = []
    for _ in range(samples):
        began = time.perf_counter()
        r = await client.get(path)
        took.append((time.perf_counter() - began) * 1000)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    return {
        "p50_ms": round(statistics.median(took), 2),
        "p95_ms": round(_pct(took, 0.95), 2),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _first_step_latency(cp: Any, site: Any, agent: str, samples: int) -> dict[str, float]:
    """Stored-at to arrival at a live view's client, for the first step of `samples` runs."""
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(site, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    base = f"http://127.0.0.1:{port}"
    runs = RunStore(cp.store)
    took = []
    try:
        async with httpx.AsyncClient(base_url=base, headers={"origin": base}) as browser:
            r = await browser.post("/login", data={"username": "admin", "password": ADMIN_PASSWORD})
            assert r.status_code == 303, r.text
            for _ in range(samples + 1):  # the first one unmeasured
                run = await cp.store.run(lambda: runs.create(agent, 1, "admin", "live"))
                await cp.store.run(lambda r=run: runs.update(r.id, status="running"))
                async with browser.stream("GET", f"/runs/{run.id}/stream") as view:
                    assert view.status_code == 200
                    await asyncio.sleep(0.1)  # the view is open and waiting, as a browser's is
                    step = await cp.runs.emit(run.id, "file.in", {"name": "in/a.csv", "size": 9})
                    async for chunk in view.aiter_bytes():
                        if b"event: step" in chunk:
                            arrived = time.time()
                            break
                stored = parse_time(step.at).timestamp()
                took.append((arrived - stored) * 1000)
    finally:
        server.should_exit = True
        await serving
    took = took[1:]
    return {
        "p50_ms": round(statistics.median(took), 2),
        "p95_ms": round(_pct(took, 0.95), 2),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with running_plane(plane_settings(Path(tmp))) as plane:
            cp = plane.cp
            async with plane.client(plane.admin_token) as api:
                agents = [
                    (await api.post("/v1/agents", json={"name": f"agent-{n}"})).json()["id"]
                    for n in range(10)
                ]
            _fill_runs(cp, agents, args.runs)
            fill_seconds = await _fill_audit(cp, args.records)
            site = site_of(plane.app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=site),  # type: ignore[arg-type]
                base_url="http://aamp.bench",
                headers={"origin": "http://aamp.bench"},
            ) as browser:
                r = await browser.post(
                    "/login", data={"username": "admin", "password": ADMIN_PASSWORD}
                )
                assert r.status_code == 303, r.text
                deep = max(0, args.records - 1000)
                pages = {
                    "runs, newest": "/runs",
                    "runs, one agent + status": f"/runs?agent={agents[3]}&status=failed",
                    "runs, a page far back": f"/runs?before=run-{args.runs // 2:012x}",
                    "audit, first page": "/admin/audit",
                    "audit, deep page": f"/admin/audit?after_seq={deep}",
                    "audit, by actor": "/admin/audit?actor=user%3Au7",
                    "audit, denials by actor, deep": f"/admin/audit?actor=user%3Au7&decision=deny"
                    f"&after_seq={deep // 2}",
                }
                figures = {
                    name: await _time(browser, path, args.samples) for name, path in pages.items()
                }
            figures["live view: first step, stored to client"] = await _first_step_latency(
                cp, site, agents[0], args.live_samples
            )
    return {
        "runs": args.runs,
        "audit_records": args.records,
        "audit_fill_seconds": round(fill_seconds, 1),
        "samples": args.samples,
        "pages": figures,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "run_id": secrets.token_hex(4),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--live-samples", type=int, default=50)
    result = asyncio.run(main(parser.parse_args()))
    print(f"{'page':42} {'p50 ms':>9} {'p95 ms':>9}")
    for name, f in result["pages"].items():
        print(f"{name:42} {f['p50_ms']:9.2f} {f['p95_ms']:9.2f}")
    print(f"({result['runs']} runs, {result['audit_records']} audit records)")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
