"""The guest agent's part of the browser tool: the channel operation ``browser``.

`serve` passes one browser request from the host to the sandbox's browser driver
(`aamp.guest.browser_server`, one process per sandbox, listening on a Unix socket in the
guest's /tmp) and streams the driver's answer back unchanged — DATA frames, then EOF — for
the host to check. The driver is started on the first request, and again when it has gone
away (the answer then says the browser is a new one). Nothing here looks inside requests or
answers beyond the framing; the driver and the host decide everything.

Standard library only: the agent imports this module the first time a browser request
arrives, so sandboxes that never use the browser never load it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

from aamp.guest import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HOME = "/tmp/aamp-browser"
SOCKET = HOME + "/driver.sock"
LOG = HOME + "/driver.log"
CHROMIUM = "/usr/bin/chromium"
# How long the driver may take to listen on its socket after it was started.
LISTEN_TIMEOUT = 30.0
# Beyond the request's own timeout, how long to wait for the driver's answer.
ANSWER_GRACE = 30.0
# The driver is started from the same library tree the agent runs from.
LIB_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from aamp.guest.browser_server import main; raise SystemExit(main(sys.argv[2:]))"
)


class RelayError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Driver:
    """The driver process this agent started (if any); one per sandbox."""

    lock = threading.Lock()
    process: subprocess.Popen[bytes] | None = None
    generation = 0


def serve(conn: socket.socket, request: dict[str, Any], workspace: str, env: dict[str, str]):
    """Answer the host's ``browser`` request on `conn`."""
    try:
        inner = request.get("request")
        timeout = request.get("timeout")
        if not isinstance(inner, dict):
            raise RelayError("bad_request", "request must be an object")
        if not wire.is_finite_number(timeout) or not 0 < timeout <= 24 * 3600:
            raise RelayError("bad_request", "timeout must be a positive number of seconds")
        if not os.path.exists(CHROMIUM):
            raise RelayError(
                "no_browser",
                "this sandbox's image has no browser; the agent's policy must use the "
                "browser image (image: browser)",
            )
        driver = _connect(workspace, env)
    except RelayError as exc:
        wire.send_control(conn, {"error": str(exc), "code": exc.code})
        return
    try:
        driver.settimeout(timeout + ANSWER_GRACE)
        wire.send_control(driver, inner)
        _pump(driver, conn)
    finally:
        driver.close()


def _pump(driver: socket.socket, conn: socket.socket) -> None:
    """Copy the driver's answer frames to the host until its EOF frame."""
    while True:
        try:
            ftype, payload = wire.recv_frame(driver)
        except (OSError, EOFError, wire.ProtocolError) as exc:
            why = "did not answer in time" if isinstance(exc, TimeoutError) else "stopped"
            message = f"the browser driver {why}; the next call starts it again. {_log_tail()}"
            wire.send_control(conn, {"error": message.strip(), "code": "browser_failed"})
            return
        wire.send_frame(conn, ftype, payload)
        if ftype == wire.EOF:
            return


def _try_connect() -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(SOCKET)
    except OSError:
        sock.close()
        return None
    return sock


def _connect(workspace: str, env: dict[str, str]) -> socket.socket:
    """A connection to the driver, starting it first if it is not running (once)."""
    with _Driver.lock:
        started = False
        deadline = time.monotonic() + LISTEN_TIMEOUT
        while True:
            process = _Driver.process
            if process is None or process.poll() is not None:
                if started:
                    raise RelayError(
                        "browser_failed",
                        f"the browser driver exited at start (status {process.returncode}). "
                        + _log_tail(),
                    )
                process = _start(workspace, env)
                started = True
                deadline = time.monotonic() + LISTEN_TIMEOUT
            sock = _try_connect()
            if sock is not None:
                return sock
            if time.monotonic() > deadline:
                raise RelayError(
                    "browser_failed",
                    f"the browser driver did not listen within {LISTEN_TIMEOUT:g} s",
                )
            time.sleep(0.005)


def _start(workspace: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    os.makedirs(HOME, mode=0o700, exist_ok=True)
    _Driver.generation += 1
    with open(LOG, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", BOOT, LIB_DIR, SOCKET, workspace, str(_Driver.generation)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd=workspace if os.path.isdir(workspace) else "/",
            start_new_session=True,  # not in any command's process group: it outlives them
        )
    _Driver.process = process
    return process


def _log_tail(size: int = 1200) -> str:
    try:
        with open(LOG, "rb") as f:
            f.seek(max(0, os.path.getsize(LOG) - size))
            tail = f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f"Its log ends: {tail}" if tail else ""
