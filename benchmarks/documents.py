"""Documents figures, each next to its baseline in the same run and the same docs image.

    .venv/bin/python benchmarks/documents.py [--runs 5]

Prints a table (median, p95) and writes benchmarks/results/documents.json:
- `render_pdf` of a 10-page HTML report through the documents tool (host request, worker
  process in the sandbox, answer checked), next to WeasyPrint run directly in the same
  sandbox (`python3 -c "HTML(...).write_pdf(...)"`) — the target is at most 10 % more;
- cold start of a docs sandbox (create, guest ready, `python3 -c pass`) with a 3-package
  derived layer from the wheelhouse (already built), next to a plain docs sandbox — the
  target is at most 1.1 times; and the one-time build of that layer.
Needs root, runsc, a built docs image, and pip's index for the three wheels.
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

from aamp.agents.documents_tool import DocumentsTool
from aamp.config import Settings
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, SandboxManager
from aamp.sandbox.wheelhouse import Wheelhouse

RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = ("tabulate==0.9.0", "six==1.17.0", "python-dateutil==2.9.0.post0")
DIRECT = (
    "from weasyprint import HTML; "
    "HTML(filename='/workspace/in/report.html').write_pdf('/workspace/out/direct.pdf')"
)


def report_html(pages: int = 10) -> str:
    rows = "".join(
        f"<tr><td>{i}</td><td>item {i}</td><td>{i * 17 % 1000}.00</td></tr>" for i in range(30)
    )
    sections = "".join(
        f"<section{'' if n == 1 else ' style=page-break-before:always'}><h2>Section {n}</h2>"
        f"<p>{'Lorem ipsum dolor sit amet. ' * 12}</p><table>{rows}</table></section>"
        for n in range(1, pages + 1)
    )
    return f"<!doctype html><html><body>{sections}</body></html>"


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered) * 1e3, "p95_ms": p95 * 1e3, "n": len(ordered)}


async def figures(settings: Settings, runs: int) -> dict[str, object]:
    images = ImageStore(settings)
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(settings, images, drivers, "gvisor")
    await manager.start()
    out: dict[str, object] = {}
    try:
        sb = await manager.create(CreateRequest(image="docs"))
        html = report_html().encode()
        async with manager.use(sb.id) as channel:
            await channel.put("/workspace/in/report.html", html, len(html))
        tool = DocumentsTool(lambda: manager.use(sb.id), 300)
        via_tool, direct = [], []
        for _ in range(runs):
            started = time.perf_counter()
            obs = await tool.run(
                {"action": "render_pdf", "path": "in/report.html", "output": "out/tool.pdf"}
            )
            via_tool.append(time.perf_counter() - started)
            assert obs.ok and "; 10 pages)" in obs.text, obs.text
            started = time.perf_counter()
            async with manager.use(sb.id) as channel:
                result, _, err = await channel.run(["python3", "-c", DIRECT], timeout=300)
            direct.append(time.perf_counter() - started)
            assert result.exit_code == 0, err
        await manager.destroy(sb.id)
        out["render_pdf_tool"], out["render_pdf_direct"] = summary(via_tool), summary(direct)

        Wheelhouse(settings).add(list(PACKAGES), by="benchmark")
        started = time.perf_counter()
        images.with_packages(images.get("docs"), PACKAGES)
        out["derived_layer_build_seconds"] = time.perf_counter() - started
        for label, packages in (("cold_plain", ()), ("cold_derived", PACKAGES)):
            samples = []
            for _ in range(runs):
                started = time.perf_counter()
                sb = await manager.create(CreateRequest(image="docs", packages=packages))
                async with manager.use(sb.id) as channel:
                    await channel.run(["python3", "-c", "pass"], timeout=60)
                samples.append(time.perf_counter() - started)
                await manager.destroy(sb.id)
            out[label] = summary(samples)
    finally:
        await manager.shutdown()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("run as root (gVisor sandboxes need it)", file=sys.stderr)
        return 1
    shared = ImageStore(Settings.from_env()).get("docs")
    with tempfile.TemporaryDirectory(prefix="aamp-bench-docs-") as home:
        # The shared docs image, hard-linked into an image directory of this run's own, so
        # the derived layer it builds goes with it.
        images = Path(home) / "images" / "docs"
        images.mkdir(parents=True)
        link = ["cp", "-al", str(shared.root.parent), str(images / shared.content_hash)]
        subprocess.run(link, check=True)
        (images / "current").symlink_to(shared.content_hash)
        env = {
            **os.environ,
            "AAMP_HOME": home,
            "AAMP_IMAGE_DIR": str(images.parent),
            "AAMP_RUNTIME_DIR": f"/run/aamp-bd{os.getpid()}",
        }
        found = asyncio.run(figures(Settings.from_env(env), args.runs))
    rows = [
        ("render_pdf, 10 pages: documents tool", found["render_pdf_tool"]),
        ("render_pdf, 10 pages: weasyprint directly", found["render_pdf_direct"]),
        ("docs cold start: plain", found["cold_plain"]),
        ("docs cold start: 3-package derived layer", found["cold_derived"]),
    ]
    print(f"\n{'figure':44} {'median':>10} {'p95':>10}   n")
    for name, s in rows:
        print(f"{name:44} {s['median_ms']:8.1f}ms {s['p95_ms']:8.1f}ms  {s['n']}")
    tool_ratio = rows[0][1]["median_ms"] / rows[1][1]["median_ms"]
    start_ratio = rows[3][1]["median_ms"] / rows[2][1]["median_ms"]
    print(f"\ntool vs weasyprint directly: {tool_ratio:.2f}x (target <= 1.10)")
    print(f"derived layer vs plain cold start: {start_ratio:.2f}x (target <= 1.10)")
    print(f"derived layer built once in {found['derived_layer_build_seconds']:.1f}s")
    RESULTS.mkdir(exist_ok=True)
    found.update(tool_vs_direct=tool_ratio, derived_vs_plain=start_ratio, packages=PACKAGES)
    (RESULTS / "documents.json").write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
