"""SDK overhead: `client.sandboxes.create` + `exec(["true"])` + destroy (the `with` block)
against the same three requests made by hand on one `http.client` connection, and the SDK's
exec of `true` in a live sandbox against the raw exec request. Prints a table (median and
p95), writes benchmarks/results/sdk.json. Target (never asserted): SDK one-shot ≤ 1.05 × raw.

    AAMP_IMAGE_DIR=/var/cache/aamp/images python benchmarks/sdk.py [--runs 21]

The control plane is a real `aamp up` (gVisor, the built `base` image) with its own home, as
in benchmarks/cli.py; the two ways take turns so a drifting machine moves both alike.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import sys
import tempfile
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


def alternate(
    runs: int, ours: Callable[[], object], raw: Callable[[], object]
) -> tuple[list[float], list[float]]:
    import time

    def timed(work: Callable[[], object]) -> float:
        started = time.perf_counter()
        work()
        return time.perf_counter() - started

    timed(ours), timed(raw)
    pairs = [(timed(ours), timed(raw)) for _ in range(runs)]
    return [a for a, _ in pairs], [b for _, b in pairs]


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

                ours, theirs = alternate(runs, sdk_one_shot, raw.one_shot)
                results.append(row("create+exec true+destroy", ours, theirs))
                with client.sandboxes.create(image="base", ttl=600) as sandbox:
                    ours, theirs = alternate(
                        runs, lambda: sandbox.exec(["true"]), lambda: raw.exec_true(sandbox.id)
                    )
                    results.append(row("exec true", ours, theirs))
            return results


def row(name: str, ours: list[float], raw: list[float]) -> dict[str, object]:
    mine, floor = _summary(ours), _summary(raw)
    return {
        "operation": name,
        **{f"sdk_{k}": v for k, v in mine.items()},
        **{f"raw_{k}": v for k, v in floor.items()},
        "ratio_median": round(mine["median_ms"] / floor["median_ms"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    results = measure(args.runs)
    print(f"{'operation':<28}{'sdk median':>11}{'p95':>8}{'raw median':>12}{'p95':>8}{'ratio':>7}")
    for r in results:
        print(
            f"{r['operation']:<28}{r['sdk_median_ms']:>11}{r['sdk_p95_ms']:>8}"
            f"{r['raw_median_ms']:>12}{r['raw_p95_ms']:>8}{r['ratio_median']:>7}"
        )
    save(
        RESULTS,
        "SDK calls next to the same requests by hand; ms; runs alternate",
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
