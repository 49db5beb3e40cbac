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
the worker-thread hop of the async SDK. Calls take turns, so both sides see the same load;
on a machine whose cores are busy with other work, the thread hops and every wake-up cost
more, and the figures swing with that load: compare runs made side by side.
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
from cli import _control_plane, _environment, _summary  # benchmarks/cli.py
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client
from sdk import save  # benchmarks/sdk.py

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from aamp import Client

RESULTS = Path(__file__).parent / "results" / "mcp.json"


async def measure(runs: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="aamp-bench-mcp-") as tmp:
        env = _environment(Path(tmp), compile_each_run=False)
        env["AAMP_IMAGE_DIR"] = os.environ.get("AAMP_IMAGE_DIR", "/var/cache/aamp/images")
        with _control_plane(env) as url:
            token = (Path(tmp) / "cli-token").read_text().strip()
            http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"})
            with Client(url, token) as api, api.sandboxes.create(image="base") as sandbox:
                async with McpClient(streamable_http_client(f"{url}/mcp", http_client=http)) as mcp:
                    arguments = {"sandbox_id": sandbox.id, "argv": ["true"]}

                    async def over_mcp() -> float:
                        started = time.perf_counter()
                        result = await mcp.call_tool("sandbox_exec", arguments)
                        assert not result.is_error and result.structured_content["exit_code"] == 0
                        return time.perf_counter() - started

                    def over_api() -> float:
                        started = time.perf_counter()
                        assert sandbox.exec(["true"]).ok
                        return time.perf_counter() - started

                    await over_mcp(), over_api()
                    pairs = [(await over_mcp(), over_api()) for _ in range(runs)]
    tool, direct = _summary([a for a, _ in pairs]), _summary([b for _, b in pairs])
    return {
        "operation": "exec true",
        **{f"mcp_{k}": v for k, v in tool.items()},
        **{f"api_{k}": v for k, v in direct.items()},
        "overhead_median_ms": round(tool["median_ms"] - direct["median_ms"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=51)
    args = parser.parse_args()
    r = asyncio.run(measure(args.runs))
    print(f"{'':<10}{'median ms':>10}{'p95 ms':>9}")
    print(f"{'mcp tool':<10}{r['mcp_median_ms']:>10}{r['mcp_p95_ms']:>9}")
    print(f"{'api':<10}{r['api_median_ms']:>10}{r['api_p95_ms']:>9}")
    print(f"overhead (median): {r['overhead_median_ms']} ms")
    save(RESULTS, "an MCP tool call next to its API twin; ms; calls alternate", args.runs, [r])


if __name__ == "__main__":
    main()
