"""The fleet's figures (issue 17), measured, never asserted:

    python benchmarks/fleet.py [--creates N] [--only packages] [--rounds N]

- sandbox creates per second through one replica with 3 remote hosts vs 1 (`aamp host
  serve` processes on this machine, real gVisor; the replica's own host drained so every
  create goes over the link). On one machine the hosts share its cores: the ratio says what
  placement and the link cost or spread, not what three machines would give;
- placement overhead per create, p50 and p95: one `Placement.place` (choose, lock and
  reserve: one statement) plus its `release`, on a real PostgreSQL with three host rows —
  what a create pays for being placed, apart from booting — each alone, beside the floor of
  a `SELECT 1` round trip measured interleaved, and the statements sent;
- time from a host's `kill -9` to its run being failed, against the configured heartbeat
  and lost timeout (target: lost timeout + 2 s);
- a create with packages on a remote host, the first (the wheel sent over the link and the
  packages layer built there) against the second (the layer reused), each round with a new
  wheel so its first create builds a new layer (`--only packages` measures this alone).

Writes benchmarks/results/fleet.json (`--only packages` prints its figure and writes nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "tests" / "fleet"),
                str(HERE.parent / "tests" / "agents")]  # fmt: skip

from fleet_processes import Fleet, host_state, wait_for  # noqa: E402
from pgtemp import TemporaryPostgres  # noqa: E402
from scripted_model import ScriptedModelServerForTests  # noqa: E402
from sqlalchemy import event, text  # noqa: E402

from aamp.fleet import HostFacts, HostRegistry, Need, Placement  # noqa: E402
from aamp.store import Store  # noqa: E402

HEARTBEAT, LOST = 1.0, 4.0


def _quantiles(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        "p50_ms": round(statistics.median(times) * 1000, 2),
        "p95_ms": round(times[int(len(times) * 0.95)] * 1000, 2),
    }


def placement_overhead(url: str, samples: int) -> dict[str, object]:
    """`Placement.place` and its `release` on three host rows, with the floor beside them: a
    `SELECT 1` round trip on the same pool, interleaved (on a loaded machine every round trip
    waits for a core), and the statements each placement sends."""
    store = Store.from_url(url)
    registry = HostRegistry(store, lost_after=3600)
    facts = HostFacts(("gvisor",), 64, 65536, 256, ("base@" + "0" * 64,))
    for i in range(3):
        host_id = f"bench-{i}"
        _, token = registry.add(host_id, by="bench")
        registry.register(host_id, token, facts)
    placement = Placement(registry)
    need = Need("gvisor", "base", 1.0, 512)
    statements = [0]
    event.listen(
        store.engine,
        "after_cursor_execute",
        lambda *_: statements.__setitem__(0, statements[0] + 1),
    )
    place, release, both, floor = [], [], [], []
    load = os.getloadavg()[0]
    for _ in range(samples):
        started = time.perf_counter()
        placed = placement.place(need, tuple(f"bench-{i}" for i in range(3)))
        placed_at = time.perf_counter()
        placement.release(placed, need)
        done = time.perf_counter()
        place.append(placed_at - started)
        release.append(done - placed_at)
        both.append(done - started)
        before = statements[0]
        with store.read_connection() as conn:
            started = time.perf_counter()
            conn.execute(text("SELECT 1"))
            floor.append(time.perf_counter() - started)
        statements[0] = before
    store.close()
    return {
        **_quantiles(both),
        "place": _quantiles(place),
        "release": _quantiles(release),
        "select_1_round_trip": _quantiles(floor),
        "statements_per_place_and_release": round(statements[0] / samples, 2),
        "samples": samples,
        "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


def creates_per_second(admin, count: int, concurrency: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Creates per second, and each create's host and time (which host was cold, and how
    they were spread)."""
    made: list[str] = []
    refused: list[str] = []
    each: list[tuple[str, float]] = []
    lock = threading.Lock()
    # Small enough that every create fits on one host of this machine (8 sandbox cpus).
    body = {"image": "base", "resources": {"cpus": 0.25, "memory_bytes": 256 * 2**20}}

    def worker(n: int) -> None:
        for _ in range(n):
            started = time.perf_counter()
            r = admin.post("/v1/sandboxes", json=body)
            took = time.perf_counter() - started
            with lock:
                if r.status_code == 201:
                    made.append(r.json()["id"])
                    each.append((r.json()["host"], took))
                else:
                    refused.append(r.text)

    per = [count // concurrency + (i < count % concurrency) for i in range(concurrency)]
    threads = [threading.Thread(target=worker, args=(n,)) for n in per]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    for sandbox_id in made:
        admin.delete(f"/v1/sandboxes/{sandbox_id}")
    if refused:
        raise SystemExit(f"{len(refused)} creates were refused: {refused[0]}")
    hosts = sorted({h for h, _ in each})
    return {
        "per_second": count / elapsed,
        "per_host": {
            h: {
                "creates": sum(1 for x, _ in each if x == h),
                "seconds": [round(t, 2) for x, t in each if x == h],
            }
            for h in hosts
        },
    }


def kill_to_failed(fleet: Fleet, admin, hosts) -> float:  # type: ignore[no-untyped-def]
    turns = [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 120"}}]},
        {"sleep": 60, "content": "never"},
    ]
    with ScriptedModelServerForTests(turns) as model:
        agent = admin.post("/v1/agents", json={"name": "bench"}).json()["id"]
        admin.put("/v1/policies/p", json={"name": "p"})
        admin.put(
            "/v1/model-endpoints/llm-bench",
            json={"base_url": model.base_url, "models": ["scripted"]},
        )
        for kind, item in (("policy", "p"), ("image", "base"), ("model-endpoint", "llm-bench")):
            admin.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": item})
        admin.put(
            f"/v1/agents/{agent}/draft",
            json={
                "model": {"endpoint": "llm-bench", "name": "scripted", "timeout": "60s"},
                "system_prompt": "bench",
                "tools": ["shell"],
                "policy": "p",
            },
        )
        admin.post(f"/v1/agents/{agent}/publish")
        run_id = admin.post(f"/v1/agents/{agent}/runs", json={"task": "t"}).json()["id"]
        wait_for(lambda: len(model.requests) >= 1, 120)
        time.sleep(2)
        sandbox_id = admin.get(f"/v1/runs/{run_id}").json()["sandbox_id"]
        victim = hosts[admin.get(f"/v1/sandboxes/{sandbox_id}").json()["host"]]
        victim.proc.kill()
        killed = time.monotonic()
        wait_for(lambda: admin.get(f"/v1/runs/{run_id}").json()["status"] == "failed", 60, 0.05)
        return time.monotonic() - killed


def packages_first_vs_second(admin, rounds: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Per round: a new wheel in the replica's wheelhouse, then two creates whose policy lists
    it — the first sends the wheel and builds the layer on the host, the second reuses it."""
    from wheel_files import make_wheel

    first, second = [], []
    with tempfile.TemporaryDirectory(prefix="aamp-bench-wheel-") as tmp:
        for n in range(rounds):
            version = f"1.0+b{uuid.uuid4().hex[:8]}"
            wheel = make_wheel(Path(tmp), "aampbench", version, f"N = {n}\n")
            r = admin.put(f"/v1/wheelhouse/wheels/{wheel.name}", content=wheel.read_bytes())
            if r.status_code != 201:
                raise SystemExit(f"the wheel was not added: {r.text}")
            body = {"policy_document": f"name: b\nimage: base\npackages: [aampbench=={version}]\n"}
            made = []
            for times in (first, second):
                started = time.perf_counter()
                r = admin.post("/v1/sandboxes", json=body)
                times.append(time.perf_counter() - started)
                if r.status_code != 201:
                    raise SystemExit(f"a create with packages was refused: {r.text}")
                made.append(r.json()["id"])
            for sandbox_id in made:
                admin.delete(f"/v1/sandboxes/{sandbox_id}")
    return {
        "load_average": round(os.getloadavg()[0], 2),
        "rounds": rounds,
        "first_median_s": round(statistics.median(first), 3),
        "second_median_s": round(statistics.median(second), 3),
        "first_s": [round(t, 3) for t in first],
        "second_s": [round(t, 3) for t in second],
    }


def only_packages(rounds: int) -> dict[str, object]:
    """`packages_first_vs_second` on one remote host (the replica's own host drained), and on
    the replica's own host alone (no link: the single-host path), for comparison."""
    found: dict[str, object] = {}
    for where in ("remote", "local"):
        with TemporaryPostgres() as pg, tempfile.TemporaryDirectory(prefix="aamp-fleet-") as tmp:
            db = pg.create_database(f"f_{uuid.uuid4().hex[:8]}")
            fleet = Fleet(Path(tmp), db.render_as_string(hide_password=False), "1", "4")
            try:
                admin = fleet.replica("rep-a")
                if where == "remote":
                    admin.post("/v1/hosts/rep-a/drain")
                    fleet.add_host(admin, "h1").start()
                    wait_for(lambda a=admin: host_state(a, "h1")["state"] == "active", 120)
                found[where] = packages_first_vs_second(admin, rounds)
            finally:
                fleet.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--creates", type=int, default=9)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="of the packages figure")
    parser.add_argument("--only", choices=["packages"], help="measure only this figure")
    args = parser.parse_args()
    result: dict[str, object] = {}
    if args.only == "packages":
        result["packages_remote"] = only_packages(args.rounds)
        print(json.dumps(result, indent=2))
        return
    with TemporaryPostgres() as pg, tempfile.TemporaryDirectory(prefix="aamp-fleet-") as tmp:
        url = pg.create_database("placement")
        result["placement"] = placement_overhead(url.render_as_string(hide_password=False), 300)
        print("placement", result["placement"], flush=True)

        db = pg.create_database(f"f_{uuid.uuid4().hex[:8]}").render_as_string(hide_password=False)
        fleet = Fleet(Path(tmp), db, str(HEARTBEAT), str(LOST))
        try:
            admin = fleet.replica("rep-a")
            admin.post("/v1/hosts/rep-a/drain")
            hosts = {h: fleet.add_host(admin, h) for h in ("h1", "h2", "h3")}
            hosts["h1"].start()
            wait_for(lambda: host_state(admin, "h1")["state"] == "active", 120)
            one = creates_per_second(admin, args.creates, args.concurrency)
            for h in ("h2", "h3"):
                hosts[h].start()
            for h in ("h2", "h3"):
                wait_for(lambda h=h: host_state(admin, h)["state"] == "active", 120)
            three = creates_per_second(admin, args.creates, args.concurrency)
            result["creates_per_second"] = {
                "load_average": round(os.getloadavg()[0], 2),
                "one_host": round(one["per_second"], 2),  # type: ignore[arg-type]
                "three_hosts": round(three["per_second"], 2),  # type: ignore[arg-type]
                "ratio": round(three["per_second"] / one["per_second"], 2),  # type: ignore[operator]
                "one_host_creates": one["per_host"],
                "three_hosts_creates": three["per_host"],
                "creates": args.creates,
                "concurrency": args.concurrency,
            }
            print("creates", result["creates_per_second"], flush=True)
            result["packages_remote"] = packages_first_vs_second(admin, args.rounds)
            print("packages on a remote host", result["packages_remote"], flush=True)
            seconds = kill_to_failed(fleet, admin, hosts)
            result["kill_to_failed"] = {
                "seconds": round(seconds, 2),
                "heartbeat_seconds": HEARTBEAT,
                "lost_seconds": LOST,
                "target_seconds": LOST + 2,
            }
            print("kill -9 to failed", result["kill_to_failed"], flush=True)
        finally:
            left = fleet.close()
        result["sandboxes_left"] = len(left)
    out = HERE / "results" / "fleet.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
