"""The guest agent: the one program in a sandbox that talks to the host.

The sandbox has no network; its only way to the host is one channel, and the *host listens*
on it: the agent dials ``--connect unix:/run/aamp/agent.sock`` (gVisor: the socket's directory
is bind-mounted at /run/aamp and runsc's ``--fsgofer-host-uds`` lets the guest connect) or
``--connect vsock:2:5000`` (Firecracker forwards it to a Unix socket on the host). So the host
never needs a way *into* the guest, and a guest that is gone simply stops dialling.

Model: one request per connection. The agent keeps exactly one idle connection dialled to the
host at all times; the first frame on every connection is the agent's hello (protocol,
version, pid). When a request arrives on the idle connection the agent first dials a new
spare, then serves the request on the old connection in a thread and closes it, so the host
always has a connection ready and a request costs no extra round trip. Operations (the host
side and its validation live in `aamp.sandbox.channel`):

- ``health``: uptime, load average, available memory.
- ``exec``: argv, env (merged onto PATH/HOME=/root/LANG=C.UTF-8), cwd (default: the
  workspace), optional streamed stdin, timeout. The command runs in its own session (so its
  own process group); stdout/stderr are streamed as they come; a ``kill`` message, the
  timeout, or the host closing the connection kills the whole process group. Ends with one
  result message: exit code, or signal, and whether it timed out.
- ``put``: a file into the workspace, written to a temporary file next to it and renamed,
  refused unless exactly the declared number of bytes arrives.
- ``get``: a file out of the workspace: its size first, then the data, then EOF.
- ``browser``: one request for the sandbox's browser driver, started on first use and kept
  across requests (`aamp.guest.browser_relay`); its answer comes back as DATA frames + EOF.

Paths for put/get are resolved with realpath and must stay inside the workspace (``--workspace``,
default /workspace), so a symlink cannot lead out; the host checks paths too.

With ``--egress ENDPOINT`` the agent also runs the guest's only way out: a forwarder listening
on 127.0.0.1:3128 that carries each TCP connection made to it, byte for byte, over a fresh
connection to the host's egress proxy (``unix:/run/aamp/egress.sock`` or ``vsock:2:5001``),
and every command gets HTTP_PROXY/HTTPS_PROXY pointing at it (NO_PROXY=localhost,127.0.0.1).
The forwarder understands nothing; the host's proxy decides everything.

As the sandbox's first process (pid 1) the agent forks: the parent only reaps zombies and
exits with the agent's status; the child is the agent. With ``--init`` (Firecracker, where no
container runtime prepares the guest) pid 1 first mounts /proc, /sys, /dev, /tmp, /run and
sets the hostname. If the host goes away the agent redials with a short backoff for
``--retry-seconds`` and then exits non-zero.

Installed in every image as::

    /opt/aamp/lib/aamp/__init__.py
    /opt/aamp/lib/aamp/guest/*.py   # every module of the package (`images._guest_files`)
    /opt/aamp/agent          # a copy of aamp/guest/launcher.py, mode 0755:
        #!/usr/bin/python3 -IS
        import sys; sys.path.insert(0, "/opt/aamp/lib")
        from aamp.guest.agent import main; raise SystemExit(main())

(The shebang is ``-IS``, not ``-I -S``: Linux passes everything after the interpreter as one
argument, and Python rejects "-I -S" as an option.)

Standard library only; never imports anything from ``aamp`` outside ``aamp.guest``.

This module is the dispatcher (dial, hello, one request per connection, the table of
operations, health) and the entry point; one module per other job: `args.py` (the command
line), `endpoint.py` (where to dial), `errors.py` (refusals and the log line), `files.py`
(put and get), `exec_runner.py` (a command), `forwarder.py` (the way out), `pid1.py` (the
first process), `browser_relay.py` (the browser).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time

from aamp.guest import files, wire
from aamp.guest.args import USAGE, parse_args
from aamp.guest.endpoint import CONNECT_TIMEOUT, Endpoint, parse_endpoint
from aamp.guest.errors import RequestError, log
from aamp.guest.exec_runner import BASE_ENV, ExecRun, ExecSpec
from aamp.guest.forwarder import FORWARDER_ADDRESS, PROXY_ENV, Forwarder
from aamp.guest.pid1 import init_system, run_as_pid1

# No argparse, dataclasses or typing at run time: in a gVisor guest each module imported adds
# to the agent's start-up (measured: these three cost ~60 ms of a ~190 ms import), and every
# cold sandbox waits for the agent before its first command.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

AGENT_VERSION = "0.1.0"
# The frame type the first stage hands a spare connection over with (no request on it yet).
HANDOFF_IDLE = 0
# How long an error reply waits for the host to stop sending (see `_drain`).
DRAIN_TIMEOUT = 10.0


class Agent:
    def __init__(
        self,
        endpoint: Endpoint,
        workspace: str,
        retry_seconds: float,
        base_env: dict[str, str] | None = None,
        handoff_fd: int | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.handoff_fd = handoff_fd
        self.workspace = os.path.realpath(workspace)
        self.retry_seconds = retry_seconds
        self.base_env = dict(BASE_ENV if base_env is None else base_env)
        self.started = time.monotonic()

    # connections

    def _dial_once(self) -> socket.socket:
        sock = socket.socket(self.endpoint.family, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT)
            sock.connect(self.endpoint.address)
            sock.settimeout(None)
            hello = {
                "hello": "aamp-guest",
                "protocol": wire.PROTOCOL_VERSION,
                "version": AGENT_VERSION,
                "pid": os.getpid(),
            }
            wire.send_control(sock, hello)
        except BaseException:
            sock.close()
            raise
        return sock

    def dial(self) -> socket.socket | None:
        """Dial the host, retrying with a short backoff for `retry_seconds`."""
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.005
        while True:
            try:
                return self._dial_once()
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    log(f"cannot reach the host at {self.endpoint.text}: {exc}; giving up")
                    return None
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def run(self) -> int:
        try:
            os.makedirs(self.workspace, exist_ok=True)
        except OSError as exc:
            log(f"cannot create the workspace {self.workspace}: {exc}")
        if self.handoff_fd is not None:
            threading.Thread(target=self._take_handoff, name="handoff", daemon=True).start()
        spare = self.dial()
        if spare is None:
            return 1
        while True:
            try:
                ftype, payload = wire.recv_frame(spare)
            except (OSError, EOFError, wire.ProtocolError):
                # The host closed our idle connection (restart, or it is gone): redial.
                spare.close()
                spare = self.dial()
                if spare is None:
                    return 1
                continue
            request_conn = spare
            spare = self.dial()
            worker = threading.Thread(
                target=self.serve, args=(request_conn, ftype, payload), daemon=True
            )
            worker.start()
            if spare is None:
                worker.join()
                return 1

    def _take_handoff(self) -> None:
        """What the first stage hands over: connections it dialled, each with the frame it
        read from it (a request it did not serve itself) or none (a spare, idle: served
        when a request comes on it), until it closes its end."""
        assert self.handoff_fd is not None
        with socket.socket(fileno=self.handoff_fd) as chan:
            while True:
                try:
                    first, fds, _, _ = socket.recv_fds(chan, wire.HEADER_SIZE, 1)
                    if not first:
                        return  # the first stage is done handing over
                    header = bytes(first) + wire.recv_exact(chan, wire.HEADER_SIZE - len(first))
                    length, ftype = wire.HEADER.unpack(header)
                    payload = wire.recv_exact(chan, length) if length else bytearray()
                except (OSError, EOFError, wire.ProtocolError) as exc:
                    log(f"cannot take the first stage's connection: {exc}")
                    return
                for extra in fds[1:]:
                    os.close(extra)
                if not fds:
                    continue
                conn = socket.socket(fileno=fds[0])
                conn.setblocking(True)
                target = self._serve_idle if ftype == HANDOFF_IDLE else self.serve
                args = (conn,) if ftype == HANDOFF_IDLE else (conn, ftype, payload)
                threading.Thread(target=target, args=args, daemon=True).start()

    def _serve_idle(self, conn: socket.socket) -> None:
        """A spare the first stage dialled: the request that comes on it, if one does."""
        try:
            ftype, payload = wire.recv_frame(conn)
        except (OSError, EOFError, wire.ProtocolError):
            conn.close()  # the host closed it (or sent garbage): nothing to answer
            return
        self.serve(conn, ftype, payload)

    # requests

    def serve(self, conn: socket.socket, ftype: int, payload: bytearray) -> None:
        try:
            try:
                if ftype != wire.CONTROL:
                    raise RequestError("bad_request", "a request must be a control message")
                request = wire.decode_control(payload)
                op = request.get("op")
                handler = self._handlers().get(op) if isinstance(op, str) else None
                if handler is None:
                    raise RequestError("bad_request", f"unknown operation {request.get('op')!r}")
                handler(conn, request)
            except RequestError as exc:
                self._reply_error(conn, exc.code, str(exc))
            except wire.ProtocolError as exc:
                self._reply_error(conn, "bad_request", str(exc))
            except (OSError, EOFError):
                pass  # the host went away mid-request; nothing to tell it
            except Exception as exc:  # keep serving other requests whatever happens here
                log(f"internal error: {exc!r}")
                self._reply_error(conn, "internal", f"guest agent error: {exc!r}")
        finally:
            _drain(conn)
            conn.close()

    def _handlers(self) -> dict[str, Callable[[socket.socket, dict[str, Any]], None]]:
        return {
            "health": self.health,
            "exec": self.exec,
            "put": self.put,
            "get": self.get,
            "browser": self.browser,
        }

    def _reply_error(self, conn: socket.socket, code: str, message: str) -> None:
        with contextlib.suppress(OSError):
            wire.send_control(conn, {"error": message[:2000], "code": code})

    def health(self, conn: socket.socket, request: dict[str, Any]) -> None:
        try:
            load: list[float] | None = list(os.getloadavg())
        except OSError:
            load = None
        wire.send_control(
            conn,
            {
                "ok": True,
                "uptime": round(time.monotonic() - self.started, 6),
                "load": load,
                "mem_available": _mem_available(),
            },
        )

    def exec(self, conn: socket.socket, request: dict[str, Any]) -> None:
        spec = ExecSpec.from_request(request, self.workspace, self.base_env)
        ExecRun(conn, spec).run()

    def browser(self, conn: socket.socket, request: dict[str, Any]) -> None:
        # Imported on first use: sandboxes that never browse never load it.
        from aamp.guest import browser_relay

        browser_relay.serve(conn, request, self.workspace, self.base_env)

    def put(self, conn: socket.socket, request: dict[str, Any]) -> None:
        files.put(conn, request, self.workspace)

    def get(self, conn: socket.socket, request: dict[str, Any]) -> None:
        files.get(conn, request, self.workspace)


def _drain(conn: socket.socket) -> None:
    """After the last message of a request, read and discard until the host hangs up (it does
    so as soon as it has the answer). The host must be the one to close: if it wrote to a
    connection we had already closed (a kill racing the command's end, stdin the command did
    not read, data after an early refusal), it would see a reset and could lose the answer
    still queued for it."""
    conn.settimeout(DRAIN_TIMEOUT)
    buf = bytearray(wire.MAX_PAYLOAD)
    try:
        while conn.recv_into(buf):
            pass
    except OSError:
        pass


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# --- entry point -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        endpoint = parse_endpoint(args["connect"])
        egress = parse_endpoint(args["egress"]) if args["egress"] else None
    except ValueError as exc:
        log(f"{exc}\n{USAGE}")
        return 2
    if args["init"]:
        try:
            init_system(args["hostname"])
        except OSError as exc:
            log(f"init failed: {exc}")
            return 1

    def agent_main() -> int:
        base_env = dict(BASE_ENV)
        if egress is not None:
            try:
                Forwarder(egress, listener_fd=args["forwarder_fd"]).start()
            except OSError as exc:
                log(f"cannot listen on {FORWARDER_ADDRESS[0]}:{FORWARDER_ADDRESS[1]}: {exc}")
                return 1
            base_env.update(PROXY_ENV)
        return Agent(
            endpoint, args["workspace"], args["retry_seconds"], base_env, args["handoff_fd"]
        ).run()

    if os.getpid() == 1:
        return run_as_pid1(agent_main)
    return agent_main()
