"""SDK overhead: `client.sandboxes.create` + `exec(["true"])` + destroy (the `with` block)
against the same three requests made by hand on one `http.client` connection, and the SDK's
exec of `true` in a live sandbox against the raw exec request. Prints a table (median and
p95), writes benchmarks/results/sdk.json. Target (never asserted): SDK one-shot ≤ 1.05 × raw.

    AAMP_IMAGE_DIR=/var/cache/aamp/images python benchmarks/sdk.py [--runs 41]

The control plane is a real `aamp up` (gVisor, the built `base` image) with its own home, as
in benchmarks/cli.py. The two ways are timed in pairs, back to back, the order switching from
one pair to the next (SDK first, then raw first), and the ratio is taken pair by pair: its
median (and p95) is the figure, not the ratio of two medians, so a machine whose speed drifts
(other work on its cores, a sandbox boot that is slow for everyone) moves both halves of a
pair alike and not the figure. The load average is printed with it: compare runs made at
like loads. So is the CPU this process spends per call on each side: what the SDK itself
costs beyond the requests, which a busy machine moves far less than wall time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cli import _control_plane, _environment, _summary  # benchmarks/cli.py

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from aamp import Client

RESULTS = Path(__file__).parent / "results" / "sdk.json"


class RawApi:
    """The API by hand: one http.client connection, JSON in, NDJSON exec output read out."""

    def __init__(self, url: str, token: str):
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port))
        self.headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}

    def send(self, method: str, path: str, body: object = None) -> bytes:
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data, headers=self.headers)
        resp = self.conn.getresponse()
        out = resp.read()
        if resp.status >= 300:
            raise SystemExit(f"{method} {path}: {resp.status} {out!r}")
        return out

    def exec_true(self, sandbox_id: str) -> None:
        out = self.send("POST", f"/v1/sandboxes/{sandbox_id}/exec", {"argv": ["true"]})
        assert json.loads(out.splitlines()[-1]).get("exit_code") == 0

    def one_shot(self) -> None:
        made = json.loads(self.send("POST", "/v1/sandboxes", {"image": "base", "ttl_seconds": 120}))
        self.exec_true(made["id"])
        self.send("DELETE", f"/v1/sandboxes/{made['id']}")


class Timings:
    """One way's wall seconds per call, and the CPU seconds this process spent on them."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu = 0.0

    def time(self, work: Callable[[], object]) -> None:
        spent, started = time.process_time(), time.perf_counter()
        work()
        self.wall.append(time.perf_counter() - started)
        self.cpu += time.process_time() - spent


def alternate(
    runs: int, ours: Callable[[], object], raw: Callable[[], object]
) -> tuple[Timings, Timings]:
    """Each way, `runs` pairs timed back to back, who goes first switching every pair
    (after one untimed pair)."""
    ours(), raw()
    mine, theirs = Timings(), Timings()
    for n in range(runs):
        if n % 2:
            theirs.time(raw)
            mine.time(ours)
        else:
            mine.time(ours)
            theirs.time(raw)
    return mine, theirs


def paired(ours: list[float], raw: list[float]) -> dict[str, float]:
    """The pair-by-pair figures: median and p95 of ours/raw and of ours - raw (ms)."""
    ratios = [a / b for a, b in zip(ours, raw, strict=True)]
    diffs = [(a - b) * 1000 for a, b in zip(ours, raw, strict=True)]

    def p95(values: list[float]) -> float:
        return statistics.quantiles(values, n=20)[18]

    return {
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_p95": round(p95(ratios), 3),
        "diff_median_ms": round(statistics.median(diffs), 2),
        "diff_p95_ms": round(p95(diffs), 2),
    }


def load() -> str:
    """The 1-, 5- and 15-minute load averages, as uptime prints them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(runs: int) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="aamp-bench-sdk-") as tmp:
        env = _environment(Path(tmp), compile_each_run=False)
        env["AAMP_IMAGE_DIR"] = os.environ.get("AAMP_IMAGE_DIR", "/var/cache/aamp/images")
        with _control_plane(env) as url:
            token = (Path(tmp) / "cli-token").read_text().strip()
            raw = RawApi(url, token)
            results = []
            with Client(url, token) as client:

                def sdk_one_shot() -> None:
                    with client.sandboxes.create(image="base", ttl=120) as sandbox:
                        assert sandbox.exec(["true"]).ok

                at = load()
                ours, theirs = alternate(runs, sdk_one_shot, raw.one_shot)
                results.append(row("create+exec true+destroy", ours, theirs, at))
                with client.sandboxes.create(image="base", ttl=600) as sandbox:
                    at = load()
                    ours, theirs = alternate(
                        runs, lambda: sandbox.exec(["true"]), lambda: raw.exec_true(sandbox.id)
                    )
                    results.append(row("exec true", ours, theirs, at))
            return results


def row(name: str, ours: Timings, raw: Timings, started_at_load: str) -> dict[str, object]:
    mine, floor = _summary(ours.wall), _summary(raw.wall)
    return {
        "operation": name,
        **{f"sdk_{k}": v for k, v in mine.items()},
        **{f"raw_{k}": v for k, v in floor.items()},
        **paired(ours.wall, raw.wall),
        # The client's own CPU per call: what the SDK costs beyond the requests themselves.
        "sdk_cpu_ms": round(ours.cpu / len(ours.wall) * 1000, 2),
        "raw_cpu_ms": round(raw.cpu / len(raw.wall) * 1000, 2),
        "load": f"{started_at_load} -> {load()}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=41)
    args = parser.parse_args()
    results = measure(args.runs)
    print(
        f"{'operation':<26}{'sdk p50':>9}{'p95':>8}{'raw p50':>9}{'p95':>8}"
        f"{'ratio p50':>11}{'p95':>7}{'cpu sdk':>9}{'raw':>6}  load"
    )
    for r in results:
        print(
            f"{r['operation']:<26}{r['sdk_median_ms']:>9}{r['sdk_p95_ms']:>8}"
            f"{r['raw_median_ms']:>9}{r['raw_p95_ms']:>8}{r['ratio_median']:>11}"
            f"{r['ratio_p95']:>7}{r['sdk_cpu_ms']:>9}{r['raw_cpu_ms']:>6}  {r['load']}"
        )
    save(
        RESULTS,
        "SDK calls next to the same requests by hand; ms; pairs back to back, the order "
        "switching; ratio_* and diff_* are pair by pair",
        args.runs,
        results,
    )


def save(path: Path, what: str, runs: int, results: list[dict[str, object]]) -> None:
    """The figures as JSON, with what was measured and on what host."""
    host = {"python": platform.python_version(), "cpus": os.cpu_count()}
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(dict(what=what, runs=runs, host=host, results=results), indent=2))


if __name__ == "__main__":
    main()
