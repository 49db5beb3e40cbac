"""CLI latency: whole `aamp` commands against a running control plane, next to curl of the same
route. Prints a table (median and p95 of each), writes benchmarks/results/cli.json.

    python benchmarks/cli.py                     # 21 runs of each
    python benchmarks/cli.py --runs 51
    python benchmarks/cli.py --compile-each-run  # as with PYTHONDONTWRITEBYTECODE and no cache

Each run is a new process, as a user's command is: the interpreter's start, imports, argument
parsing, the request, the output. The server is a real `aamp up` on loopback with its own
home; `aamp sandbox ls` lists no sandboxes (none need to boot), so the figure is the CLI's
own cost plus one authorised, audited read. curl of the route is the floor for that read,
and `python -c pass` the floor for starting the interpreter; `aamp --help` makes no request.
Commands take turns (aamp, curl, aamp, curl, ...) so a machine whose speed drifts moves both
alike, after one unmeasured run each. Figures are measured, never asserted.

The commands run from a copy of this tree's `src/aamp` (first on PYTHONPATH), so they measure
this code and no earlier bytecode of it. By default Python caches the copy's bytecode at the
unmeasured first run and reuses it, as on any installation; `--compile-each-run` forbids the
cache (PYTHONDONTWRITEBYTECODE), so every run compiles aamp's modules from source.
"""

from __future__ import annotations

import argparse
import contextlib
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
import urllib.request
from collections.abc import Iterator
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "cli.json"
SOURCE = Path(__file__).resolve().parent.parent / "src" / "aamp"
PYTHON_PASS = [sys.executable, "-c", "pass"]
ROUTES = {"sandbox ls": "/v1/sandboxes", "user ls": "/v1/users", "run ls": "/v1/runs"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _aamp() -> list[str]:
    """The console script users type, if installed beside this interpreter."""
    script = Path(sys.executable).with_name("aamp")
    return [str(script)] if script.exists() else [sys.executable, "-m", "aamp"]


def _wait_for_health(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"aamp up exited before it answered:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url + "/v1/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("aamp up did not answer within 60 s")


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()}")
    return elapsed


def _summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "median_ms": round(statistics.median(ms), 1),
        "p95_ms": round(statistics.quantiles(ms, n=20)[18], 1),
        "min_ms": round(ms[0], 1),
    }


def _environment(home: Path, *, compile_each_run: bool) -> dict[str, str]:
    code = home / "src"
    shutil.copytree(SOURCE, code / "aamp", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if compile_each_run:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return {
        **env,
        "PYTHONPATH": str(code),
        "AAMP_HOME": str(home),
        "AAMP_RUNTIME_DIR": f"/run/aamp-b{secrets.token_hex(4)}",
        "AAMP_IMAGE_DIR": str(home / "no-images"),
        "AAMP_PORT": str(_free_port()),
        "AAMP_DRIVER": "gvisor",
        "AAMP_ADMIN_PASSWORD": "benchmark-admin-password",
    }


@contextlib.contextmanager
def _control_plane(env: dict[str, str]) -> Iterator[str]:
    """A real `aamp up` for the length of the block; yields its API's URL."""
    with _control_plane_process(env) as (url, _):
        yield url


@contextlib.contextmanager
def _control_plane_process(env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """As `_control_plane`, yielding its API's URL and the process's id."""
    url = f"http://127.0.0.1:{env['AAMP_PORT']}"
    log = Path(env["AAMP_HOME"]) / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*_aamp(), "up"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_health(proc, url, log)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _alternating(
    runs: int, env: dict[str, str], ours: list[str], floor: list[str]
) -> tuple[list[float], list[float]]:
    """`runs` timings of each, taking turns, after one unmeasured run of each."""
    _timed(ours, env)
    _timed(floor, env)
    pairs = [(_timed(ours, env), _timed(floor, env)) for _ in range(runs)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def measure(runs: int, *, compile_each_run: bool) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="aamp-bench-cli-") as tmp:
        env = _environment(Path(tmp), compile_each_run=compile_each_run)
        with _control_plane(env) as url:
            token = (Path(tmp) / "cli-token").read_text().strip()
            curl = ["curl", "-sf", "-o", "/dev/null", "-H", f"authorization: Bearer {token}"]
            commands = [
                (f"aamp {words}", words.split(), f"curl {route}", [*curl, url + route])
                for words, route in ROUTES.items()
            ]
            commands.append(("aamp --help", ["--help"], "python -c pass", PYTHON_PASS))
            results = []
            for name, words, floor_name, floor in commands:
                ours, theirs = _alternating(runs, env, [*_aamp(), *words], floor)
                next_to = {f"next_to_{k}": v for k, v in _summary(theirs).items()}
                results.append(
                    {"command": name, **_summary(ours), "next_to": floor_name, **next_to}
                )
            return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="measured runs of each command")
    parser.add_argument(
        "--compile-each-run", action="store_true", help="no bytecode cache: compile every run"
    )
    args = parser.parse_args()
    if args.runs < 2:
        raise SystemExit("--runs must be at least 2 (a p95 needs two)")
    if shutil.which("curl") is None:
        raise SystemExit("curl is not installed; it is the yardstick")
    results = measure(args.runs, compile_each_run=args.compile_each_run)
    bytecode_cache = not args.compile_each_run
    print(f"{args.runs} runs each; bytecode cache {'on' if bytecode_cache else 'off'}")
    print(
        f"{'command':<16}{'median ms':>10}{'p95 ms':>9}   {'next to':<20}{'median ms':>10}"
        f"{'p95 ms':>9}"
    )
    for r in results:
        print(
            f"{r['command']:<16}{r['median_ms']:>10}{r['p95_ms']:>9}   {r['next_to']:<20}"
            f"{r['next_to_median_ms']:>10}{r['next_to_p95_ms']:>9}"
        )
    document = {
        "what": "wall time of whole processes, each a new one; runs alternate",
        "runs": args.runs,
        "bytecode_cache": bytecode_cache,
        "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "results": results,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
