"""Why a microVM stopped, or makes no progress, in words: from its exit code, its console (a
kernel panic, the OOM killer), Firecracker's own log and its metrics."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from aamp.sandbox.kvm import detect_kvm


def exit_reason(code: int | None, console: Path, log: Path) -> str:
    text = tail(console, 64 * 1024)
    panic = re.search(r"Kernel panic - not syncing: ([^\r\n]*)", text)
    oom = "Out of memory" in text or "oom-kill" in text
    if panic:
        why = f"the guest kernel panicked: {panic.group(1).strip()}"
        return why + (" (the guest ran out of memory)" if oom else "")
    if code is None:
        found = re.findall(r"exit_code=(\d+)", tail(log, 16 * 1024))
        code = int(found[-1]) if found else None
    if code is not None and code < 0:
        return f"firecracker was killed by signal {-code} on the host"
    if code == 0:
        return "the guest shut down or rebooted (firecracker exited normally)"
    if code is not None:
        return f"firecracker exited with code {code}: {tail(log, 300)}"
    return "the microVM's process is no longer running"


def last_line(path: Path, chunk: int = 1 << 16) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - chunk))
            lines = fh.read().strip().splitlines()
    except OSError:
        return ""
    return lines[-1].decode(errors="replace") if lines else ""


def tail(path: Path, limit: int = 600) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return "(no output)"
    return data.decode(errors="replace").strip() or "(no output)"


def progress_words(m: dict[str, Any]) -> str:
    """Whether a guest does anything, from one metrics flush: vCPU exits and console writes."""
    vcpu, uart = m.get("vcpu", {}), m.get("uart", {})
    kinds = ("exit_io_in", "exit_io_out", "exit_mmio_read", "exit_mmio_write")
    exits = sum(int(vcpu.get(k, 0)) for k in kinds)
    if exits == 0 and int(uart.get("write_count", 0)) == 0:
        kvm = detect_kvm()
        why = f" ({kvm.reason})" if kvm.pvm else ""
        return f"the guest made no progress: no vCPU exits, nothing on its console{why}"
    return f"the guest is running: {exits} vCPU exits, {uart.get('write_count', 0)} console writes"
