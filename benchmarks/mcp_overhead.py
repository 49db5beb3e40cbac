"""MCP overhead: the `sandbox_exec` tool running `true` over `/mcp` (streamable HTTP, the
official MCP client) against the same exec through the API (the SDK), in one live sandbox.
Prints a table (median and p95 of each, and the difference), writes
benchmarks/results/mcp.json. Target (never asserted): <= 5 ms p50 over the API call. (Not
named mcp.py: that would hide the `mcp` package from this script.)

    AAMP_IMAGE_DIR=/var/cache/aamp/images python benchmarks/mcp_overhead.py [--runs 51]

A tool call is one MCP POST, authenticated by the API guard's token check, whose tool makes
the API request through the SDK client kept for its token, in process (an ASGI call of the
same app, no loopback socket: `aamp.mcp.in_process`); so the difference is MCP's framing and
validation on both sides (the official client's share is most of it), that token check and
the MCP SDK's own per-request work on the server (a stateless session, its task group and
streams, the arguments' and result's validation). The two are timed in pairs, back to back,
the order switching every pair, and the overhead is taken pair by pair: its median and p95
are the figures (not the difference of two medians), so an exec that is slow for both sides
(a busy machine: the figures swing with its load, printed beside them) does not move them.
The CPU each side spends per call — the benchmark's own process (the two clients) and the
control plane's — is printed too: on a shared machine it moves far less than wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from cli import _control_plane_process, _environment, _summary  # benchmarks/cli.py
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client
from sdk import load, paired, save  # benchmarks/sdk.py

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from aamp import Client

RESULTS = Path(__file__).parent / "results" / "mcp.json"
TICK = os.sysconf("SC_CLK_TCK")


class CpuSpent:
    """CPU seconds of this process and of the control plane's (all its threads; not the
    sandboxes', which are processes of their own), summed per kind of call: a busy machine
    stretches wall time far more than it moves these."""

    def __init__(self, server_pid: int) -> None:
        self._stat = Path(f"/proc/{server_pid}/stat")
        self.ours: dict[str, float] = {}
        self.server: dict[str, float] = {}

    def _server_now(self) -> float:
        fields = self._stat.read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime

    def count(self, kind: str, started: tuple[float, float]) -> None:
        self.ours[kind] = self.ours.get(kind, 0.0) + time.process_time() - started[0]
        self.server[kind] = self.server.get(kind, 0.0) + self._server_now() - started[1]

    def now(self) -> tuple[float, float]:
        return time.process_time(), self._server_now()


async def measure(runs: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="aamp-bench-mcp-") as tmp:
        env = _environment(Path(tmp), compile_each_run=False)
        env["AAMP_IMAGE_DIR"] = os.environ.get("AAMP_IMAGE_DIR", "/var/cache/aamp/images")
        with _control_plane_process(env) as (url, pid):
            cpu = CpuSpent(pid)
            token = (Path(tmp) / "cli-token").read_text().strip()
            http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"})
            with Client(url, token) as api, api.sandboxes.create(image="base") as sandbox:
                async with McpClient(streamable_http_client(f"{url}/mcp", http_client=http)) as mcp:
                    arguments = {"sandbox_id": sandbox.id, "argv": ["true"]}

                    async def over_mcp() -> float:
                        spent, started = cpu.now(), time.perf_counter()
                        result = await mcp.call_tool("sandbox_exec", arguments)
                        took = time.perf_counter() - started
                        cpu.count("mcp", spent)
                        assert not result.is_error and result.structured_content["exit_code"] == 0
                        return took

                    def over_api() -> float:
                        spent, started = cpu.now(), time.perf_counter()
                        assert sandbox.exec(["true"]).ok
                        took = time.perf_counter() - started
                        cpu.count("api", spent)
                        return took

                    await over_mcp(), over_api()
                    cpu.ours.clear(), cpu.server.clear()
                    at = load()
                    tools, directs = [], []
                    for n in range(runs):
                        if n % 2:
                            directs.append(over_api())
                            tools.append(await over_mcp())
                        else:
                            tools.append(await over_mcp())
                            directs.append(over_api())
    tool, direct, pairs = _summary(tools), _summary(directs), paired(tools, directs)
    return {
        "operation": "exec true",
        **{f"mcp_{k}": v for k, v in tool.items()},
        **{f"api_{k}": v for k, v in direct.items()},
        "overhead_median_ms": pairs["diff_median_ms"],
        "overhead_p95_ms": pairs["diff_p95_ms"],
        **{
            f"cpu_{side}_{kind}_ms": round(spent[kind] / runs * 1000, 2)
            for side, spent in (("client", cpu.ours), ("server", cpu.server))
            for kind in ("mcp", "api")
        },
        "load": f"{at} -> {load()}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=51)
    args = parser.parse_args()
    r = asyncio.run(measure(args.runs))
    print(f"{'':<10}{'median ms':>10}{'p95 ms':>9}")
    print(f"{'mcp tool':<10}{r['mcp_median_ms']:>10}{r['mcp_p95_ms']:>9}")
    print(f"{'api':<10}{r['api_median_ms']:>10}{r['api_p95_ms']:>9}")
    print(
        f"overhead, pair by pair: median {r['overhead_median_ms']} ms, "
        f"p95 {r['overhead_p95_ms']} ms (load {r['load']})"
    )
    for side in ("client", "server"):
        mcp, api = r[f"cpu_{side}_mcp_ms"], r[f"cpu_{side}_api_ms"]
        print(f"{side} cpu per call: mcp {mcp} ms, api {api} ms, difference {mcp - api:.2f} ms")
    what = "an MCP tool call next to its API twin; ms; pairs back to back, the order switching"
    save(RESULTS, what, args.runs, [r])


if __name__ == "__main__":
    main()
