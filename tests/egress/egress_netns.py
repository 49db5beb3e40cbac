"""Run a test scenario inside a network namespace the test creates, so nothing can leave.

Boundary tests aim at 169.254.169.254, 1.1.1.1, 10.0.0.5 and friends. They must never send a
packet off this machine, even if the proxy under test fails open. So the whole scenario — the
proxy, the fake "outside" hosts and the attacking client — runs in a child process started with
`unshare --net`: a fresh namespace whose only interface is loopback. The child first proves
that (it refuses to run if any interface but `lo` exists), brings `lo` up, adds every fake
address to it, then runs the scenario coroutine and prints its JSON result as the last line.

Usage (from a test)::

    result = run_in_netns("egress_attacks:run", {"workdir": str(tmp)}, ["169.254.169.254"])
"""

from __future__ import annotations

import asyncio
import importlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
MARKER = "AAMP-NETNS-RESULT "


class NetnsUnavailable(RuntimeError):
    pass


def netns_available() -> str | None:
    """None if `unshare --net` works here, else why not (the caller skips the test)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip (iproute2) is not installed"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    return None


def run_in_netns(target: str, args: dict, addresses: list[str], timeout: float = 120) -> dict:
    """Run `module:function(args)` (an async function) in a fresh network namespace."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    payload = json.dumps({"target": target, "args": args, "addresses": addresses})
    proc = subprocess.run(
        ["unshare", "--net", "--", sys.executable, str(Path(__file__)), payload],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"netns scenario {target} failed (exit {proc.returncode}):\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return json.loads(lines[-1][len(MARKER) :])


def _interfaces() -> list[str]:
    # /proc/self/net/dev is per network namespace (unlike /sys/class/net without a remount).
    rows = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    return [row.split(":", 1)[0].strip() for row in rows]


def _enter(addresses: list[str]) -> None:
    interfaces = _interfaces()
    if interfaces != ["lo"]:
        raise SystemExit(f"refusing to run: not an isolated namespace (interfaces {interfaces})")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for address in addresses:
        ip = ipaddress.ip_address(address)
        prefix = f"{ip}/{32 if ip.version == 4 else 128}"
        extra = ["nodad"] if ip.version == 6 else []
        subprocess.run(["ip", "addr", "add", prefix, "dev", "lo", *extra], check=True)


def _main() -> None:
    spec = json.loads(sys.argv[1])
    _enter(spec["addresses"])
    module_name, func_name = spec["target"].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    result = asyncio.run(func(spec["args"]))
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    _main()
