"""Small process helpers the drivers share: run a tool, find and kill processes by command line.

Finding processes by command line is how leftovers are reaped after the host process died:
every process a driver starts names the installation's runtime directory in its arguments,
so a scan of /proc finds them without any in-memory state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def run_quiet(argv: Sequence[str], timeout: float = 30.0) -> str:
    """Run a tool and return its stdout; any failure yields an empty string (callers probe)."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


async def run_async(argv: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
    """Run a tool without blocking the event loop; returns (exit code, combined output)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"{argv[0]} timed out after {timeout}s"
    return proc.returncode or 0, out.decode(errors="replace")


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def pids_matching(*needles: str) -> list[int]:
    """Pids whose command line contains every needle (as a substring of some argument)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        args = cmdline(int(entry.name))
        if args and all(any(n in a for a in args) for n in needles):
            found.append(int(entry.name))
    return found


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_matching(*needles: str, wait: float = 5.0) -> list[int]:
    """SIGKILL every process matching `needles` and wait (bounded) until they are gone."""
    pids = pids_matching(*needles)
    for pid in pids:
        kill_pid(pid)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.01)
    return pids
