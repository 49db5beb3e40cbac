"""MCP overhead: the `sandbox_exec` tool running `true` over `/mcp` (streamable HTTP) against
the same exec through the API (the SDK), in one live sandbox. Prints a table (median and p95
of each, and the overhead of each way of calling the tool), writes benchmarks/results/mcp.json.
Target (never asserted): <= 5 ms p50 over the API call. (Not named mcp.py: that would hide
the `mcp` package from this script.)

    AAMP_IMAGE_DIR=/var/cache/aamp/images python benchmarks/mcp_overhead.py [--runs 51] \
        [--baseline OTHER/src]

(`--baseline`: another tree's control plane too, its calls in the same rounds as this one's,
for a before-and-after under the same load.)

The target is the MCP call's overhead over the equivalent API call, so two figures are given,
each a pair of calls with equally efficient clients:
- `equal clients` (`overhead_*`, the target's figure) — `post` over `api post`: the same
  bare client (`http.client`, a kept connection, one write) sends the MCP `tools/call` and
  the API's exec, so the difference is what serving MCP adds and nothing of either client;
- `official` (`official_overhead_*`) — the official MCP client over aamp's SDK, as a program
  using each would see it (the official client's own CPU is most of the difference).

The tool is called three ways:
- `mcp` — the official MCP client as a program keeps it (one client, its connection reused;
  it speaks protocol 2026-07-28, where every request stands alone: no session to keep);
- `mcp legacy` — the official client speaking 2025-11-25 (`mode="legacy"`: an initialize
  handshake, then every call against `/mcp`'s stateless server), as clients of that
  protocol do;
- `post` — one JSON-RPC POST with the headers and body the official client sends (its name
  aside), by `http.client` on a kept connection, head and body in one write (the official
  client's transport writes them apart): the same server work with
  a client that costs next to nothing, so its overhead over `api post` (the API's exec as
  one POST by the same bare client, its NDJSON answer read to the end) is what the server
  adds, and `mcp` minus `post` is the official client's share.
and the API two ways: `api`, the SDK (`sandbox.exec`), and `api post`.

A tool call is one MCP POST, authenticated by the API guard's token check, whose tool makes
the API request through the SDK client kept for its token, in process (an ASGI call of the
same app, no loopback socket: `aamp.mcp.in_process`); so the server's share is that token
check, the MCP SDK's per-request work (the JSON-RPC envelope's validation, the tool's
arguments and result, the answer's serialisation) and the SDK client's own reading of the
API's answer, which in the API call is the caller's. The calls are timed in rounds, back to
back, the order rotating every round, and each overhead is taken round by round (a tool
call minus the API call of its round): its median and p95 are the figures (not the
difference of two medians), so an exec that is slow for all (a busy machine: the figures
swing with its load, printed beside them) does not move them. The CPU each way spends per
call — the benchmark's own process (the client) and the control plane's — is printed too:
on a shared machine it moves far less than wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx2
from cli import _control_plane_process, _environment, _summary  # benchmarks/cli.py
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client
from sdk import load, paired, save  # benchmarks/sdk.py

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from aamp import Client

RESULTS = Path(__file__).parent / "results" / "mcp.json"
KINDS = ("mcp", "mcp_legacy", "post", "api", "api_post")
# Each tool call's API twin: the official client's is the SDK, the bare POST's a bare POST.
TWIN = {"mcp": "api", "mcp_legacy": "api", "post": "api_post"}
PROTOCOL = "2026-07-28"  # the version the official client speaks by default


class CpuSpent:
    """CPU seconds of this process and of the control plane's (all its threads, to the
    nanosecond: their schedstat; not the sandboxes', which are processes of their own),
    summed per kind of call: a busy machine stretches wall time far more than it moves these.
    Neither side's count includes reading the other's."""

    def __init__(self, server_pid: int) -> None:
        self._tasks = Path(f"/proc/{server_pid}/task")
        self.ours: dict[str, float] = {}
        self.server: dict[str, float] = {}

    def _server_now(self) -> float:
        spent = 0
        for task in self._tasks.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that has just ended
                spent += int((task / "schedstat").read_text().split()[0])
        return spent / 1e9

    def now(self) -> tuple[float, float]:
        server = self._server_now()
        return time.process_time(), server

    def count(self, kind: str, started: tuple[float, float]) -> None:
        ours = time.process_time() - started[0]
        self.server[kind] = self.server.get(kind, 0.0) + self._server_now() - started[1]
        self.ours[kind] = self.ours.get(kind, 0.0) + ours


def _connection(url: str) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port))


class OnePost:
    """A `tools/call` as one JSON-RPC POST on a kept `http.client` connection, with the
    headers and body the official client sends under protocol 2026-07-28."""

    def __init__(self, url: str, token: str, tool: str, arguments: dict[str, object]) -> None:
        self.conn = _connection(url)
        self.headers = {
            "authorization": f"Bearer {token}",
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": PROTOCOL,
            "mcp-method": "tools/call",
            "mcp-name": tool,
        }
        self.params = {
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                "io.modelcontextprotocol/clientInfo": {"name": "benchmark", "version": "0"},
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        }
        self.calls = 0

    def call(self) -> dict[str, object]:
        self.calls += 1
        body = {"jsonrpc": "2.0", "id": self.calls, "method": "tools/call", "params": self.params}
        self.conn.request("POST", "/mcp", body=json.dumps(body).encode(), headers=self.headers)
        resp = self.conn.getresponse()
        answer = json.loads(resp.read())
        if resp.status != 200 or "result" not in answer:
            raise SystemExit(f"POST /mcp: {resp.status} {answer!r}")
        return answer["result"]  # type: ignore[no-any-return]


class OneApiPost:
    """The API's exec as one POST on a kept `http.client` connection, as `OnePost` sends
    the tool call: the headers the SDK sends, its NDJSON answer read to the end; the result
    is its last line."""

    def __init__(self, url: str, token: str, sandbox_id: str, argv: list[str]) -> None:
        self.conn = _connection(url)
        self.path = f"/v1/sandboxes/{sandbox_id}/exec"
        self.headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        self.body = json.dumps({"argv": argv, "env": {}, "cwd": None}).encode()

    def call(self) -> dict[str, object]:
        self.conn.request("POST", self.path, body=self.body, headers=self.headers)
        resp = self.conn.getresponse()
        lines = resp.read().splitlines()
        if resp.status != 200:
            raise SystemExit(f"POST {self.path}: {resp.status} {lines!r}")
        return json.loads(lines[-1])  # type: ignore[no-any-return]


Call = Callable[[], Awaitable[None]]


async def _plane(
    stack: contextlib.AsyncExitStack, home: Path, source: Path | None
) -> tuple[CpuSpent, dict[str, Call]]:
    """A control plane (from `source`, a tree holding `aamp/`, or this one) with one live
    sandbox, and each way of calling the exec of `true` in it."""
    env = _environment(home, compile_each_run=False)
    env["AAMP_IMAGE_DIR"] = os.environ.get("AAMP_IMAGE_DIR", "/var/cache/aamp/images")
    if source is not None:
        shutil.rmtree(home / "src" / "aamp")
        shutil.copytree(
            source / "aamp", home / "src" / "aamp", ignore=shutil.ignore_patterns("__pycache__")
        )
    url, pid = stack.enter_context(_control_plane_process(env))
    token = (home / "cli-token").read_text().strip()
    api = stack.enter_context(Client(url, token))
    sandbox = stack.enter_context(api.sandboxes.create(image="base"))
    arguments = {"sandbox_id": sandbox.id, "argv": ["true"]}
    post = OnePost(url, token, "sandbox_exec", arguments)
    api_post = OneApiPost(url, token, sandbox.id, ["true"])

    async def official(mode: str) -> McpClient:
        http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"})
        client = McpClient(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode)
        return await stack.enter_async_context(client)

    mcp, legacy = await official("auto"), await official("legacy")
    assert mcp.protocol_version == PROTOCOL, mcp.protocol_version
    assert legacy.protocol_version != PROTOCOL, legacy.protocol_version

    def tool(client: McpClient) -> Call:
        async def call() -> None:
            result = await client.call_tool("sandbox_exec", arguments)
            assert not result.is_error
            assert result.structured_content["exit_code"] == 0

        return call

    async def over_post() -> None:
        result = post.call()
        assert not result["isError"]
        assert result["structuredContent"]["exit_code"] == 0  # type: ignore[index]

    async def over_api() -> None:  # blocks the loop, as the POST does: no hop
        assert sandbox.exec(["true"]).ok

    async def over_api_post() -> None:
        result = api_post.call()
        assert result.get("exit_code") == 0 and "error" not in result, result

    ways = (tool(mcp), tool(legacy), over_post, over_api, over_api_post)
    return CpuSpent(pid), dict(zip(KINDS, ways, strict=True))


def _figures(runs: int, took: dict[str, list[float]], cpu: CpuSpent) -> dict[str, object]:
    result: dict[str, object] = {"operation": "exec true"}
    for kind in KINDS:
        result |= {f"{kind}_{k}": v for k, v in _summary(took[kind]).items()}
    for kind, twin in TWIN.items():
        pairs = paired(took[kind], took[twin])
        result[f"{kind}_overhead_median_ms"] = pairs["diff_median_ms"]
        result[f"{kind}_overhead_p95_ms"] = pairs["diff_p95_ms"]
    # The target's figure: equally efficient clients (the same bare POST both ways).
    result["overhead_median_ms"] = result["post_overhead_median_ms"]
    result["overhead_p95_ms"] = result["post_overhead_p95_ms"]
    result["official_overhead_median_ms"] = result["mcp_overhead_median_ms"]
    result["official_overhead_p95_ms"] = result["mcp_overhead_p95_ms"]
    for side, spent in (("client", cpu.ours), ("server", cpu.server)):
        result |= {f"cpu_{side}_{kind}_ms": round(spent[kind] / runs * 1000, 2) for kind in KINDS}
    return result


async def measure(runs: int, baseline: Path | None) -> list[dict[str, object]]:
    """This tree's figures, and `baseline`'s (another source tree's control plane, its calls
    in the same rounds as ours) when given."""
    trees: dict[str, Path | None] = {"this tree": None}
    if baseline is not None:
        trees["baseline"] = baseline
    with tempfile.TemporaryDirectory(prefix="aamp-bench-mcp-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            planes = {
                name: await _plane(stack, Path(tmp) / str(n), source)
                for n, (name, source) in enumerate(trees.items())
            }
            calls = [(name, kind) for name in planes for kind in KINDS]

            async def timed(name: str, kind: str) -> float:
                cpu, ways = planes[name]
                spent, started = cpu.now(), time.perf_counter()
                await ways[kind]()
                took = time.perf_counter() - started
                cpu.count(kind, spent)
                return took

            for name, kind in calls:
                await timed(name, kind)
            for cpu, _ in planes.values():
                cpu.ours.clear(), cpu.server.clear()
            at = load()
            took = {name: {kind: [] for kind in KINDS} for name in planes}
            for n in range(runs):
                turn = n % len(calls)
                for name, kind in calls[turn:] + calls[:turn]:
                    took[name][kind].append(await timed(name, kind))
            at = f"{at} -> {load()}"
    return [
        {"tree": name, **_figures(runs, took[name], cpu), "load": at}
        for name, (cpu, _) in planes.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=51)
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another source tree (holding aamp/, e.g. a worktree of main's src) whose control "
        "plane is measured in the same rounds, for a before-and-after",
    )
    args = parser.parse_args()
    if args.baseline is not None and not (args.baseline / "aamp" / "__init__.py").is_file():
        parser.error(f"--baseline {args.baseline}: no aamp package there (give a tree's src/)")
    results = asyncio.run(measure(args.runs, args.baseline))
    for r in results:
        _print(r)
    what = "an MCP tool call three ways next to its API twin; ms; rounds back to back, rotating"
    save(RESULTS, what, args.runs, results)


def _print(r: dict[str, object]) -> None:
    print(r["tree"])
    print(
        f"{'':<12}{'median ms':>10}{'p95 ms':>9}{'over':>10}{'median':>8}{'p95':>8}"
        f"{'cpu ms: client':>16}{'server':>8}"
    )
    for kind in KINDS:
        over = (
            f"{TWIN[kind].replace('_', ' '):>10}{r[f'{kind}_overhead_median_ms']:>8}"
            f"{r[f'{kind}_overhead_p95_ms']:>8}"
            if kind in TWIN
            else f"{'':>26}"
        )
        print(
            f"{kind.replace('_', ' '):<12}{r[f'{kind}_median_ms']:>10}{r[f'{kind}_p95_ms']:>9}"
            f"{over}{r[f'cpu_client_{kind}_ms']:>16}{r[f'cpu_server_{kind}_ms']:>8}"
        )
    print(
        f"MCP overhead p50, equal clients (post over api post): {r['overhead_median_ms']} ms; "
        f"official client over the SDK: {r['official_overhead_median_ms']} ms"
    )
    print(f"load {r['load']}; overheads and cpu per call, taken round by round")


if __name__ == "__main__":
    main()
