"""Browser tool figures in gVisor, each next to its baseline measured in the same run.

    .venv/bin/python benchmarks/browser.py [--rounds 4] [--warm 30]

Prints a table and writes benchmarks/results/browser.json:
- bare chromium: in a fresh sandbox, `chromium --headless=new --dump-dom URL` through the
  egress proxy — start, load the legacy app's login page, print it, exit — timed from the host;
- first action: in a fresh sandbox, the browser tool's first call (`open` of the same page:
  the guest starts the browser driver, chromium and Playwright, loads the page and answers
  with its snapshot), timed from the host around `BrowserTool.run`; the ratio to the bare
  start is the figure that matters (target: at most 1.2);
- warm actions: after logging in, `--warm` rounds of a click (no navigation), a fill and a
  read of one table cell, each timed from the host (target: p50 at most 300 ms).

Each round uses a fresh sandbox and alternates which of the two starts goes first; one round
is run first to warm the host's page cache and is not counted. The legacy app
(tests/agents/legacy_app.py) is served on 127.0.0.1 as `legacy.bench`, reached only through
the egress proxy. Needs root, runsc and a built browser image. Figures are measured, never
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aamp.agents.browser_settings import BrowserSettings
from aamp.agents.browser_tool import BrowserTool
from aamp.config import Settings
from aamp.egress.resolver import StaticResolver
from aamp.egress.rules import EgressRules
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, SandboxManager

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
CELL = "#invoices tbody tr:first-child td:nth-child(3)"
sys.path.insert(0, str(REPO / "tests" / "agents"))
from legacy_app import LegacyAppForTests  # noqa: E402  (the legacy-style app)


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50_ms": statistics.median(ordered) * 1e3, "p95_ms": p95 * 1e3, "n": len(ordered)}


class Bench:
    def __init__(self, manager: SandboxManager, base: str) -> None:
        self.manager = manager
        self.base = base

    async def sandbox(self) -> tuple[str, BrowserTool]:
        egress = EgressRules.from_lists("block", allow=["legacy.bench"])
        sandbox = await self.manager.create(CreateRequest(image="browser", egress=egress))
        tool = BrowserTool(
            lambda: self.manager.use(sandbox.id),
            120,
            BrowserSettings(),
            await self.manager.egress_view(sandbox.id),
        )
        return sandbox.id, tool

    async def call(self, tool: BrowserTool, **args: Any) -> float:
        started = time.perf_counter()
        observation = await tool.run(args)
        took = time.perf_counter() - started
        if not observation.ok:
            raise RuntimeError(f"{args}: {observation.text[:500]}")
        return took

    async def bare_chromium(self, sandbox_id: str) -> float:
        profile = f"--user-data-dir=/tmp/bare-{secrets.token_hex(4)}"
        argv = [
            "chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
            "--proxy-server=http://127.0.0.1:3128", profile, "--dump-dom", f"{self.base}/login",
        ]  # fmt: skip
        async with self.manager.use(sandbox_id) as channel:
            started = time.perf_counter()
            result, out, err = await channel.run(argv, timeout=120)
            took = time.perf_counter() - started
        if result.exit_code != 0 or b"Please log in" not in out:
            raise RuntimeError(f"bare chromium failed: {err.decode(errors='replace')[-800:]}")
        return took

    async def first_action(self, tool: BrowserTool) -> float:
        return await self.call(tool, action="open", url=f"{self.base}/login")

    async def round(self, n: int) -> tuple[float, float]:
        """One fresh sandbox per start; the order alternates with `n`."""
        times: dict[str, float] = {}
        for which in ("bare", "first") if n % 2 == 0 else ("first", "bare"):
            sandbox_id, tool = await self.sandbox()
            try:
                if which == "bare":
                    times["bare"] = await self.bare_chromium(sandbox_id)
                else:
                    times["first"] = await self.first_action(tool)
            finally:
                await self.manager.destroy(sandbox_id, reason="benchmark round done")
        return times["bare"], times["first"]

    async def warm(self, rounds: int) -> dict[str, list[float]]:
        sandbox_id, tool = await self.sandbox()
        try:
            await self.first_action(tool)
            await self.call(tool, action="fill", role="textbox", name="User name", value="clerk")
            await self.call(tool, action="fill", role="textbox", name="Password", value="s3cret")
            await self.call(tool, action="click", role="button", name="Log in")
            samples: dict[str, list[float]] = {"click": [], "fill": [], "read": []}
            for i in range(rounds):
                samples["click"].append(
                    await self.call(tool, action="click", role="textbox", name="Search")
                )
                samples["fill"].append(
                    await self.call(
                        tool, action="fill", role="textbox", name="Search", value=f"q{i}"
                    )
                )
                samples["read"].append(await self.call(tool, action="read", selector=CELL))
            return samples
        finally:
            await self.manager.destroy(sandbox_id, reason="benchmark done")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        raise SystemExit("the benchmark runs real gVisor sandboxes: it needs root and runsc")
    home = Path(tempfile.mkdtemp(prefix="aamp-bench-browser-"))
    settings = Settings.from_env(
        {
            "AAMP_HOME": str(home),
            "AAMP_RUNTIME_DIR": f"/run/aamp-bb{secrets.token_hex(3)}",
            "AAMP_IMAGE_DIR": os.environ.get("AAMP_IMAGE_DIR") or str(REPO / ".aamp" / "images"),
        }
    )
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(settings, ImageStore(settings), drivers, "gvisor")
    manager.resolver = StaticResolver({"legacy.bench": ["127.0.0.1"]})
    with LegacyAppForTests("127.0.0.1") as app:
        bench = Bench(manager, f"http://legacy.bench:{app.port}")
        await manager.start()
        try:
            await bench.round(0)  # warms the host's page cache; not counted
            bare, first = [], []
            for n in range(args.rounds):
                b, f = await bench.round(n)
                bare.append(b)
                first.append(f)
                print(f"round {n + 1}: bare chromium {b:6.2f} s   first action {f:6.2f} s")
            warm = await bench.warm(args.warm)
        finally:
            await manager.shutdown()
            shutil.rmtree(settings.runtime_dir, ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)
    ratios = [f / b for b, f in zip(bare, first, strict=True)]
    all_warm = [t for samples in warm.values() for t in samples]
    return {
        "bare_chromium": summary(bare),
        "first_action": summary(first),
        "first_over_bare_p50": round(statistics.median(ratios), 3),
        "first_over_bare_target": 1.2,
        "warm": {name: summary(samples) for name, samples in warm.items()},
        "warm_all": summary(all_warm),
        "warm_p50_target_ms": 300,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=4, help="fresh-sandbox rounds of the two starts")
    p.add_argument("--warm", type=int, default=30, help="rounds of click, fill and read")
    p.add_argument("--json", type=Path, default=RESULTS / "browser.json")
    args = p.parse_args()
    report = asyncio.run(main_async(args))
    rows = [
        ("bare chromium start + load", report["bare_chromium"]),
        ("first browser action", report["first_action"]),
        *((f"warm {name}", s) for name, s in report["warm"].items()),
        ("warm, all", report["warm_all"]),
    ]
    print(f"\n{'figure':<28} {'p50 ms':>9} {'p95 ms':>9} {'n':>4}")
    for name, s in rows:
        print(f"{name:<28} {s['p50_ms']:9.1f} {s['p95_ms']:9.1f} {s['n']:4d}")
    print(f"first action / bare chromium (p50 of ratios): {report['first_over_bare_p50']:.2f}"
          f" (target <= 1.2); warm p50 target <= 300 ms")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
