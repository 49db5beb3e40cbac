"""Every speed figure of the product's table (issue 18), each with its baseline from the same
run, in one command:

    python benchmarks/all.py [--quick]

Runs, one after another, `sandbox_start.py`, `egress.py` and `api.py` (each in its own
process, so none shares an interpreter with another), reads the JSON each writes to
benchmarks/results/, and prints one table: figure, aamp, baseline, ratio or added, target.
The machine's load average is printed before and after: on a shared host the figures move
with it. `--quick` takes fewer samples (for a smoke run; quote the full run). Figures are
measured, never asserted. Writes benchmarks/results/all.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _run(script: str, *args: str) -> None:
    command = [sys.executable, str(HERE / script), *args]
    print(f"$ {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def rows() -> list[tuple[str, str, str, str, str]]:
    """(figure, aamp, baseline, ratio/added, target) from the results just written."""
    start = _load("sandbox_start.json")
    egress = _load("egress.json")
    api = {r["backend"]: r for r in _load("api.json")["results"]}

    def ms(s: dict) -> str:
        return f"{s['median_ms']:.1f} ms (p95 {s['p95_ms']:.1f})"

    def taken(warm: dict) -> str:  # how a warm figure was taken (sandbox_start.how_taken)
        n = warm["n"]
        return (
            f"every {warm['spacing_s_median']:.2f}s, full {warm['pool_full']}/{n}, "
            f"refill beside {warm['refill_booting_beside']}/{n}, warm {warm['warm']}/{n}, "
            f"{warm['cpu_ms_per_create_median']:.2f} CPU ms"
        )

    tp, lat = egress["throughput_mib_s"], egress["latency_ms"]

    def through(mode: str, target: str) -> tuple[str, str, str, str, str]:
        row, base = tp[mode], tp[tp[mode]["baseline"]]
        return (
            f"{egress['download_mib']} MiB, {mode}",
            f"{row['median']:.0f} MiB/s",
            f"{base['median']:.0f} MiB/s ({row['baseline']})",
            f"{row['ratio_to_direct']:.2f}x",
            target,
        )

    def added(mode: str, target: str) -> tuple[str, str, str, str, str]:
        row, base = lat[mode], lat[lat[mode]["baseline"]]
        return (
            f"small request, {mode}",
            f"{row['p50']:.3f} ms (p95 {row['p95']:.3f})",
            f"{base['p50']:.3f} ms ({row['baseline']})",
            f"+{row['added_p50']:.3f} ms",
            target,
        )

    out = [
        (
            "cold create + python3 -c pass",
            ms(start["aamp_cold"]),
            ms(start["baseline_runsc_run_python"]) + " (runsc run)",
            f"{start['cold_vs_raw_ratio']:.2f}x (paired {start['cold_vs_raw_paired_ratio']:.2f}x)",
            "<= 1.15x",
        ),
        (
            "warm pool create + true",
            ms(start["aamp_warm"]),
            ms(start["aamp_cold_true"]) + " (cold create + true)",
            taken(start["aamp_warm"]),
            "<= 20 ms p50",
        ),
        (
            "a run's sandbox (policy warm: 1)",
            ms(start["run_sandbox_configured"]),
            ms(start["run_sandbox_cold"]) + " (cold)",
            taken(start["run_sandbox_configured"]),
            "<= 20 ms p50",
        ),
        (
            "a run's sandbox (learned pool)",
            ms(start["run_sandbox_warm"]),
            ms(start["run_sandbox_cold"]) + " (cold)",
            taken(start["run_sandbox_warm"]),
            "<= 20 ms p50",
        ),
        through("floor", "(no target: a bare splice relay on the same hops, the floor)"),
        through("proxy-http", ">= 0.8x"),
        through("connect", ">= 0.8x"),
        through("intercept", ">= 0.5x"),
        added("proxy-http", "<= 0.5 ms"),
        added("intercept", "<= 1 ms"),
    ]
    for backend, r in api.items():
        out.append(
            (
                f"authorised read, 50 clients, {backend}",
                f"p50 {r['p50_ms']} / p95 {r['p95_ms']} ms",
                "",
                f"{r['requests_per_s']} req/s, {r['server_cpu_ms_per_request']} CPU ms/req",
                "p95 <= 50 ms",
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples: a smoke run")
    args = parser.parse_args()
    before = _load_average()
    quick = args.quick
    _run("sandbox_start.py", *(["--runs", "5", "--idle", "2", "--burst", "2"] if quick else []))
    _run("egress.py", *(["--runs", "1", "--mib", "20", "--small", "300"] if quick else []))
    _run("api.py", *(["--requests", "10"] if quick else []))
    after = _load_average()
    table = rows()
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    head = ("figure", "aamp", "baseline (same run)", "ratio / added", "target")
    widths = [max(w, len(h)) for w, h in zip(widths, head, strict=True)]
    print(f"\nload average before: {before}; after: {after}; cpus: {os.cpu_count()}")
    for line in (head, *table):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
    (RESULTS / "all.json").write_text(
        json.dumps({"load_before": before, "load_after": after, "rows": table}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
