"""Sandbox start-up figures, each next to its baseline measured in the same run.

    .venv/bin/python benchmarks/sandbox_start.py [--runs 20] [--idle 10] [--spacing 1.0]

Prints a table (median and p95) and writes benchmarks/results/sandbox_start.json:
- raw baselines: `runsc do true`, and `runsc run` of `python3 -c pass` in the base image tree
  with the same flags aamp uses (the floor any runsc-based start can reach), each sample taken
  beside the aamp sample it is compared with (the ratios are also given per pair);
- aamp cold: create a sandbox (boot, guest agent ready) and run `python3 -c pass` in it, and
  (the warm figures' cold baseline) create one and run `true` in it;
- aamp warm pool: take a pre-started sandbox and run `true` in it;
- a run's sandbox: a policy's request (its own resources and egress rules), cold, from the
  pool learned for its boot key (`AAMP_WARM_POOL_LEARN`), and from the pool its stored
  policy's `warm: 1` configures, each followed by `true`;
- for each warm figure, how it was taken: one create every `--spacing` seconds (start to
  start; later if its pool had no sandbox yet, and the spacing measured is printed), how many
  creates found the pool full, how many had a refill booting beside them (the manager boots
  the next sandbox behind each hand-out), how many came warm, the control plane's CPU per
  create + `true` (this process's CPU time over the sample) and the load average meanwhile;
- host memory per idle sandbox: RSS and PSS of all its host processes (runsc sandbox + gofer);
- N sandboxes started at once: wall time, and whether all answered.
Needs root, runsc and a built base image (`aamp image build base`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aamp.config import Settings
from aamp.egress.rules import EgressRules
from aamp.policy import Resources, parse_policy
from aamp.sandbox import procs
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, SandboxManager
from aamp.sandbox.warm_pool import BootKey, boot_key

RESULTS = Path(__file__).resolve().parent / "results"


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered) * 1e3, "p95_ms": p95 * 1e3, "n": len(ordered)}


class RawRunsc:
    """The raw baselines, one sample at a time, so each is taken beside the aamp sample it is
    compared with: on a shared host the load moves within a minute, and a block of baselines
    measured before a block of aamp samples compares two different machines."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.flags = ["runsc", f"--root={tmp / 'state'}", "--platform=ptrace", "--network=none"]
        self.bundle = tmp / "bundle"
        self.bundle.mkdir()
        subprocess.run(["runsc", "spec", "--bundle", str(self.bundle)], check=True)
        config = json.loads((self.bundle / "config.json").read_text())
        config["root"] = {"path": str(root), "readonly": False}
        config["process"]["terminal"] = False
        config["process"]["args"] = ["python3", "-c", "pass"]
        (self.bundle / "config.json").write_text(json.dumps(config))
        self.count = 0

    def do_true(self) -> float:
        """`runsc do true`."""
        started = time.perf_counter()
        subprocess.run([*self.flags, "do", "true"], check=True, capture_output=True)
        return time.perf_counter() - started

    def run_python(self) -> float:
        """`runsc run` of `python3 -c pass` in the image tree."""
        self.count += 1
        started = time.perf_counter()
        subprocess.run(
            [*self.flags, "--overlay", "run", "--bundle", str(self.bundle), f"raw{self.count}"],
            check=True,
            capture_output=True,
        )
        return time.perf_counter() - started


class WarmSamples:
    """Warm creates + `true`, one every `spacing` seconds, each with how it was taken."""

    def __init__(self, manager: SandboxManager, key: BootKey, spacing: float) -> None:
        self.manager, self.key, self.spacing = manager, key, spacing
        self.wall: list[float] = []
        self.cpu: list[float] = []  # this process's CPU time over each sample
        self.gaps: list[float] = []  # start to start
        self.load: list[float] = []
        self.full = self.refilling = self.warm = 0
        self._last: float | None = None

    async def take(self, request: CreateRequest) -> None:
        m, key = self.manager, self.key
        due = self._last + self.spacing if self._last is not None else time.perf_counter()
        while time.perf_counter() < due or not m._pools.get(key):
            await asyncio.sleep(0.005)
        fill = m._pool_fill.get(key)
        self.refilling += fill is not None and not fill.done()
        self.full += len(m._pools[key]) >= m.pool_targets.target(key)
        started, cpu = time.perf_counter(), time.process_time()
        if self._last is not None:
            self.gaps.append(started - self._last)
        self._last = started
        sb = await m.create(request)
        async with m.use(sb.id) as channel:
            result, _, _ = await channel.run(["true"])
        self.wall.append(time.perf_counter() - started)
        self.cpu.append(time.process_time() - cpu)
        self.load.append(os.getloadavg()[0])
        assert result.exit_code == 0
        self.warm += sb.warm
        await m.destroy(sb.id)

    def report(self) -> dict[str, object]:
        n = len(self.wall)
        return {
            **summary(self.wall),
            "spacing_s_median": statistics.median(self.gaps) if self.gaps else None,
            "pool_full": self.full,
            "refill_booting_beside": self.refilling,
            "warm": self.warm,
            "cpu_ms_per_create_median": statistics.median(self.cpu) * 1e3,
            "load_median": statistics.median(self.load),
            "n": n,
        }


def paired_ratio(aamp: list[float], base: list[float]) -> float:
    """The median of each aamp sample over the baseline taken beside it."""
    return statistics.median(a / b for a, b in zip(aamp, base, strict=True))


def memory_of(sandbox_dir: Path, runsc_root: Path) -> tuple[int, int]:
    """RSS and PSS (bytes) of every host process of one sandbox."""
    rss = pss = 0
    for pid in procs.pids_matching(f"--root={runsc_root}", str(sandbox_dir / "bundle")):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                key, _, value = line.partition(":")
                if key == "Rss":
                    rss += int(value.split()[0]) * 1024
                elif key == "Pss":
                    pss += int(value.split()[0]) * 1024
        except OSError:
            pass
    return rss, pss


async def aamp_figures(
    settings: Settings, raw: RawRunsc, runs: int, idle: int, burst: int, spacing: float
) -> dict[str, object]:
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    out: dict[str, object] = {}

    manager = SandboxManager(settings, ImageStore(settings), drivers, "gvisor")
    await manager.start()
    try:
        cold, cold_true, do_true, raw_run = [], [], [], []
        for _ in range(runs):  # each aamp sample beside its baselines (see RawRunsc)
            do_true.append(raw.do_true())
            raw_run.append(raw.run_python())
            for argv, samples in ((["python3", "-c", "pass"], cold), (["true"], cold_true)):
                started = time.perf_counter()
                sb = await manager.create(CreateRequest(image="base"))
                async with manager.use(sb.id) as channel:
                    result, _, _ = await channel.run(argv)
                samples.append(time.perf_counter() - started)
                assert result.exit_code == 0
                await manager.destroy(sb.id)
        out["cold"], out["cold_true"], out["do_true"], out["raw_run"] = (
            cold,
            cold_true,
            do_true,
            raw_run,
        )

        ids = [(await manager.create(CreateRequest(image="base"))).id for _ in range(idle)]
        await asyncio.sleep(2)  # let them settle into idle
        mem = [
            memory_of(manager.get(i).handle.state_dir, drivers["gvisor"].runsc_root) for i in ids
        ]
        out["idle_rss"] = [m[0] for m in mem]
        out["idle_pss"] = [m[1] for m in mem]
        for i in ids:
            await manager.destroy(i)

        started = time.perf_counter()
        created = await asyncio.gather(
            *(manager.create(CreateRequest(image="base")) for _ in range(burst))
        )

        async def answer(sandbox_id: str) -> bool:
            async with manager.use(sandbox_id) as channel:
                _, out_, _ = await channel.run(["echo", "ok"])
            return out_ == b"ok\n"

        answered = await asyncio.gather(*(answer(s.id) for s in created))
        out["burst_seconds"] = time.perf_counter() - started
        out["burst_ok"] = sum(answered)
        for s in created:
            await manager.destroy(s.id)
    finally:
        await manager.shutdown()

    pooled = SandboxManager(
        settings, ImageStore(settings), drivers, "gvisor", warm_pool={"base": 3}
    )
    await pooled.start()
    try:
        warm = WarmSamples(pooled, boot_key("gvisor", "base", Resources()), spacing)
        while pooled.pool_status().get("base", 0) < 3:  # the first create finds it full
            await asyncio.sleep(0.02)
        for _ in range(runs):
            await warm.take(CreateRequest(image="base"))
        out["warm"] = warm
    finally:
        await pooled.shutdown()

    # A run's sandbox: what a policy with its own resources and rules asks for.
    run_request = CreateRequest(
        image="base",
        resources=Resources(pids=128, memory_bytes=512 * 2**20),
        egress=EgressRules.from_lists("block", allow=["example.test"]),
    )
    run_key = boot_key("gvisor", "base", run_request.resources)
    # The same policy stored with `warm: 1`: its pool is configured, not learned.
    stored = parse_policy(
        "name: bench\nimage: base\nresources: {pids: 128, memory: 512MiB}\n"
        "egress: {allow: [example.test]}\nwarm: 1\n"
    )
    assert stored.resources == run_request.resources
    for kind, learn, configured in (
        ("run_cold", 0, False),
        ("run_warm", 1, False),
        ("run_configured", 0, True),
    ):
        manager = SandboxManager(
            settings, ImageStore(settings), drivers, "gvisor", learn_pools=learn
        )
        await manager.start()
        try:
            if learn:  # the first request teaches the manager the policy's boot key
                await manager.destroy((await manager.create(run_request)).id)
            if configured:
                await manager.keep_warm(stored.name, stored)
            if not (learn or configured):
                samples, beside = [], []
                for _ in range(runs):
                    beside.append(raw.do_true())
                    started = time.perf_counter()
                    sb = await manager.create(run_request)
                    async with manager.use(sb.id) as channel:
                        result, _, _ = await channel.run(["true"])
                    samples.append(time.perf_counter() - started)
                    assert result.exit_code == 0 and not sb.warm
                    await manager.destroy(sb.id)
                out[kind], out["do_true_beside_run"] = samples, beside
                continue
            pooled_run = WarmSamples(manager, run_key, spacing)
            for _ in range(runs):
                await pooled_run.take(run_request)
            out[kind] = pooled_run
        finally:
            await manager.shutdown()
    return out


def _load(avg: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in avg)


def how_taken(warm: dict[str, object]) -> str:
    """How a warm figure was taken, in one line (`WarmSamples.report`)."""
    n, spacing = warm["n"], warm["spacing_s_median"]
    every = f"a create every {spacing:.2f}s" if spacing is not None else "one create"
    return (
        f"{every}; pool full at {warm['pool_full']}/{n}, a refill booting beside "
        f"{warm['refill_booting_beside']}/{n}, warm {warm['warm']}/{n}; control-plane CPU "
        f"{warm['cpu_ms_per_create_median']:.2f} ms per create + true; "
        f"load {warm['load_median']:.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--idle", type=int, default=10, help="idle sandboxes for the memory figure")
    parser.add_argument("--burst", type=int, default=10, help="sandboxes started at once")
    parser.add_argument(
        "--spacing", type=float, default=1.0, help="seconds from one warm create to the next"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root (gVisor sandboxes need it)", file=sys.stderr)
        return 1
    settings = Settings.from_env(
        {**os.environ, "AAMP_RUNTIME_DIR": f"/run/aamp-bench-{os.getpid()}"}
    )
    image = ImageStore(settings).get("base")
    GVisorDriver(settings.runtime_dir)  # fail early if the module is broken
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="aamp-bench-") as tmp:
        raw = RawRunsc(image.root, Path(tmp))
        figures = asyncio.run(
            aamp_figures(settings, raw, args.runs, args.idle, args.burst, args.spacing)
        )
    load_after = os.getloadavg()
    do_true, raw_run = figures["do_true"], figures["raw_run"]
    warm = {kind: figures[kind].report() for kind in ("warm", "run_warm", "run_configured")}

    rows = [
        ("raw: runsc do true", summary(do_true)),
        ("raw: runsc run python3 -c pass", summary(raw_run)),
        ("aamp cold: create + python3 -c pass", summary(figures["cold"])),
        ("aamp cold: create + true", summary(figures["cold_true"])),
        ("aamp warm pool: create + true", warm["warm"]),
        ("a run's sandbox, cold: create + true", summary(figures["run_cold"])),
        ("a run's sandbox, learned pool: create + true", warm["run_warm"]),
        ("a run's sandbox, policy warm: 1: create + true", warm["run_configured"]),
    ]
    print(f"\n{'figure':48} {'median':>10} {'p95':>10}   n")
    for name, s in rows:
        print(f"{name:48} {s['median_ms']:8.1f}ms {s['p95_ms']:8.1f}ms  {s['n']}")
    ratio = rows[2][1]["median_ms"] / rows[1][1]["median_ms"]
    paired = paired_ratio(figures["cold"], raw_run)
    run_paired = paired_ratio(figures["run_cold"], figures["do_true_beside_run"])
    print(
        f"\ncold start vs raw runsc run (same command, same image): {ratio:.2f}x "
        f"(median of each sample over the baseline beside it: {paired:.2f}x)"
    )
    print(f"a run's sandbox, cold, vs runsc do true beside it: {run_paired:.2f}x")
    for name, kind in (
        ("warm pool", "warm"),
        ("learned pool", "run_warm"),
        ("policy warm: 1", "run_configured"),
    ):
        print(f"{name}: {how_taken(warm[kind])}")
    print("load average before / after: " + " / ".join(_load(x) for x in (load_before, load_after)))
    rss = statistics.median(figures["idle_rss"]) / 2**20
    pss = statistics.median(figures["idle_pss"]) / 2**20
    print(f"host memory per idle sandbox ({args.idle} idle): RSS {rss:.1f} MiB, PSS {pss:.1f} MiB")
    print(
        f"{args.burst} sandboxes at once: {figures['burst_seconds']:.2f}s, "
        f"{figures['burst_ok']}/{args.burst} answered"
    )
    RESULTS.mkdir(exist_ok=True)
    report = {
        "baseline_runsc_do_true": summary(do_true),
        "baseline_runsc_run_python": summary(raw_run),
        "aamp_cold": summary(figures["cold"]),
        "aamp_cold_true": summary(figures["cold_true"]),
        "aamp_warm": warm["warm"],
        "run_sandbox_cold": summary(figures["run_cold"]),
        "run_sandbox_warm": warm["run_warm"],
        "run_sandbox_configured": warm["run_configured"],
        "warm_spacing_s": args.spacing,
        "cold_vs_raw_ratio": ratio,
        "cold_vs_raw_paired_ratio": paired,
        "run_cold_vs_do_true_paired_ratio": run_paired,
        "load_average": {"before": load_before, "after": load_after},
        "idle_rss_mib_median": rss,
        "idle_pss_mib_median": pss,
        "burst": {
            "count": args.burst,
            "seconds": figures["burst_seconds"],
            "ok": figures["burst_ok"],
        },
    }
    (RESULTS / "sandbox_start.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
