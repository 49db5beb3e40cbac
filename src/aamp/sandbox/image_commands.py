"""Running one image-build command: finding the host tool, the build's environment, and
streaming its output as progress lines, so a killed build leaves nothing running or mounted.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

# pip runs on the host; `guest_pip_target_args` makes it choose wheels for the guest.
PIP = (sys.executable, "-m", "pip")
# The longest a build stays silent: a step with no output gets a "still running" line.
HEARTBEAT_SECONDS = 5.0
# Tool -> the Debian package that provides it, for the "install this" message.
_TOOLS = {
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
    "unshare": "util-linux",
    "setpriv": "util-linux",
    "chroot": "coreutils",
}


class ImageBuildError(RuntimeError):
    """A build step failed; the message has the command and the tail of its output."""


class MissingTool(ImageBuildError):
    """A host tool the builder needs is not installed; the message names its Debian package."""


Progress = Callable[[str], None]


def find_tool(name: str) -> str:
    """Absolute path of a host tool; sbin directories count even if not on PATH."""
    search = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    found = shutil.which(name, path=search)
    if found is None:
        raise MissingTool(
            f"'{name}' is not installed; image builds need it: apt-get install {_TOOLS[name]}"
        )
    return found


def command_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DEBIAN_FRONTEND="noninteractive",
        LC_ALL="C.UTF-8",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/local/sbin:/usr/sbin:/sbin"
    return env


def run_command(
    argv: Sequence[str],
    *,
    label: str,
    progress: Progress,
    isolate: bool = False,
    env: dict[str, str] | None = None,
) -> str:
    """Run a build command, streaming its lines to `progress`; return its output.

    Every command dies with this process (`setpriv --pdeathsig`), and an `isolate`d one runs in
    its own mount and PID namespaces: whatever it mounts (debootstrap mounts /proc in the target)
    disappears with it, and killing the namespace's first process kills all of it, so a killed
    build leaves nothing running and nothing mounted. Silence longer than HEARTBEAT_SECONDS
    yields a "still running" line. Raises ImageBuildError with the tail of the output.
    """
    prefix = [find_tool("setpriv"), "--pdeathsig", "KILL"]
    if isolate:
        prefix += [
            find_tool("unshare"),
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child=KILL",
        ]
    full = [*prefix, *argv]
    tail: deque[str] = deque(maxlen=30)
    lines: queue.Queue[str | None] = queue.Queue()
    started = time.monotonic()
    proc = subprocess.Popen(
        full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env or command_env(),
        start_new_session=True,
    )

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            # Progress bars redraw with \r; keep the last state of each line.
            text = raw.decode("utf-8", "replace").rstrip("\r\n").split("\r")[-1].rstrip()
            if text:
                lines.put(text)
        lines.put(None)

    reader = threading.Thread(target=pump, name=f"image-build-{label}", daemon=True)
    reader.start()
    try:
        while True:
            try:
                line = lines.get(timeout=HEARTBEAT_SECONDS)
            except queue.Empty:
                progress(f"  ... {label} still running ({time.monotonic() - started:.0f}s)")
                continue
            if line is None:
                break
            tail.append(line)
            progress(f"  {line}")
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
        reader.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
    if rc != 0:
        output = "\n".join(f"    {t}" for t in tail) or "    (no output)"
        raise ImageBuildError(
            f"{label} failed with exit status {rc}\n  command: {shlex.join(argv)}\n"
            f"  last output:\n{output}"
        )
    return "\n".join(tail)


def compile_guest_python(rootfs: Path, paths: Sequence[str], progress: Progress) -> None:
    """Byte-compile `paths` (absolute in the guest) with the guest's own interpreter (so the
    cache tags match), since the tree is read-only in a sandbox.

    This runs as root in a chroot, which is no boundary, so it must run no code of what it
    compiles: `-S` keeps `site` from executing the `.pth` files a wheel installs, and `-I` from
    reading the environment or a user site; compiling executes nothing."""
    run_command(
        [find_tool("chroot"), str(rootfs), "/usr/bin/python3", "-I", "-S", "-m", "compileall",
         "-q", "-j", "0", "--invalidation-mode", "unchecked-hash", *paths],
        label="compileall",
        progress=progress,
        isolate=True,
    )  # fmt: skip


def capture_command(argv: Sequence[str], *, label: str) -> str:
    """Run a short command that prints a result (not progress); raise with its output."""
    result = subprocess.run(
        [find_tool("setpriv"), "--pdeathsig", "KILL", *argv],
        capture_output=True,
        env=command_env(),
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        out = (result.stdout + result.stderr).decode("utf-8", "replace").strip()[-2000:]
        raise ImageBuildError(
            f"{label} failed with exit status {result.returncode}\n"
            f"  command: {shlex.join(argv)}\n  last output:\n    {out}"
        )
    return result.stdout.decode("utf-8", "replace")
