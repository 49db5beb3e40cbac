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
    /opt/aamp/lib/aamp/guest/__init__.py, wire.py, agent.py, browser_*.py
    /opt/aamp/agent          # a copy of aamp/guest/launcher.py, mode 0755:
        #!/usr/bin/python3 -IS
        import sys; sys.path.insert(0, "/opt/aamp/lib")
        from aamp.guest.agent import main; raise SystemExit(main())

(The shebang is ``-IS``, not ``-I -S``: Linux passes everything after the interpreter as one
argument, and Python rejects "-I -S" as an option.)

Standard library only; never imports anything from ``aamp`` outside ``aamp.guest``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import selectors
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

from aamp.guest import wire

# No argparse, dataclasses or typing at run time: in a gVisor guest each module imported adds
# to the agent's start-up (measured: these three cost ~60 ms of a ~190 ms import), and every
# cold sandbox waits for the agent before its first command.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

AGENT_VERSION = "0.1.0"
DEFAULT_WORKSPACE = "/workspace"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
OUTPUT_CHUNK = 64 * 1024
# After the command exits, output still in flight is read for this long; a background
# process that keeps the pipes open must not hold the exec open forever.
DRAIN_GRACE = 0.5
# How long an error reply waits for the host to stop sending (see `_drain`).
DRAIN_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
MAX_PATH_BYTES = 4096
FORWARDER_ADDRESS = ("127.0.0.1", 3128)
FORWARDER_CHUNK = 256 * 1024
PROXY_URL = "http://127.0.0.1:3128"
PROXY_ENV = {
    "HTTP_PROXY": PROXY_URL,
    "HTTPS_PROXY": PROXY_URL,
    "http_proxy": PROXY_URL,
    "https_proxy": PROXY_URL,
    "NO_PROXY": "localhost,127.0.0.1",
    "no_proxy": "localhost,127.0.0.1",
}


class RequestError(Exception):
    """A request the agent refuses; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def log(message: str) -> None:
    try:
        sys.stderr.write(f"aamp-agent[{os.getpid()}]: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# --- where to dial -----------------------------------------------------------------------


class Endpoint:
    __slots__ = ("address", "family", "text")

    def __init__(self, family: int, address: Any, text: str) -> None:
        self.family, self.address, self.text = family, address, text


def parse_endpoint(text: str) -> Endpoint:
    """``unix:/path`` or ``vsock:CID:PORT``."""
    kind, _, rest = text.partition(":")
    if kind == "unix" and rest.startswith("/"):
        return Endpoint(socket.AF_UNIX, rest, text)
    if kind == "vsock":
        cid, _, port = rest.partition(":")
        if cid.isdigit() and port.isdigit():
            family = getattr(socket, "AF_VSOCK", None)
            if family is None:
                raise ValueError("this Python has no AF_VSOCK support")
            return Endpoint(family, (int(cid), int(port)), text)
    raise ValueError(f"--connect must be unix:/absolute/path or vsock:CID:PORT, got {text!r}")


# --- the agent ---------------------------------------------------------------------------


class Agent:
    def __init__(
        self,
        endpoint: Endpoint,
        workspace: str,
        retry_seconds: float,
        base_env: dict[str, str] | None = None,
    ) -> None:
        self.endpoint = endpoint
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
        spec = _ExecSpec.from_request(request, self.workspace, self.base_env)
        _ExecRun(conn, spec).run()

    def browser(self, conn: socket.socket, request: dict[str, Any]) -> None:
        # Imported on first use: sandboxes that never browse never load it.
        from aamp.guest import browser_relay

        browser_relay.serve(conn, request, self.workspace, self.base_env)

    def resolve(self, path: object) -> str:
        if not isinstance(path, str) or not path:
            raise RequestError("bad_path", "path must be a non-empty string")
        if "\x00" in path or len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
            raise RequestError("bad_path", "path contains a NUL byte or is too long")
        real = os.path.realpath(os.path.join(self.workspace, path))
        if real != self.workspace and not real.startswith(self.workspace + os.sep):
            raise RequestError("path_escape", f"{path!r} resolves outside the workspace")
        return real

    def put(self, conn: socket.socket, request: dict[str, Any]) -> None:
        path = self.resolve(request.get("path"))
        size = request.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RequestError("bad_request", "size must be a non-negative integer")
        shown = request.get("path")
        if os.path.isdir(path):
            raise RequestError("is_directory", f"{shown!r} is a directory")
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise RequestError(
                "bad_path", f"cannot create the folder for {shown!r}: {exc}"
            ) from None
        tmp = os.path.join(parent, f".aamp-put-{os.urandom(8).hex()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o644)
        except OSError as exc:
            raise RequestError("write_failed", f"cannot write {shown!r}: {exc}") from None
        received = 0
        try:
            try:
                while True:
                    ftype, data = wire.recv_frame(conn)
                    if ftype == wire.EOF:
                        break
                    if ftype != wire.DATA:
                        raise RequestError(
                            "bad_request", f"unexpected {wire.type_name(ftype)} frame in put"
                        )
                    received += len(data)
                    if received > size:
                        raise RequestError(
                            "size_mismatch",
                            f"received more than the declared {size} bytes; nothing was written",
                        )
                    _write_all(fd, data)
            finally:
                os.close(fd)
            if received != size:
                raise RequestError(
                    "size_mismatch",
                    f"received {received} bytes but {size} were declared; nothing was written",
                )
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
                raise RequestError("write_failed", f"cannot write {shown!r}: {exc}") from None
            raise
        wire.send_control(conn, {"ok": True, "size": received})

    def get(self, conn: socket.socket, request: dict[str, Any]) -> None:
        path = self.resolve(request.get("path"))
        shown = request.get("path")
        max_size = request.get("max_size")
        if not isinstance(max_size, int) or isinstance(max_size, bool) or max_size < 0:
            raise RequestError("bad_request", "max_size must be a non-negative integer")
        try:
            # O_NONBLOCK: opening a FIFO must not hang; O_NOFOLLOW: the path was resolved.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise RequestError("not_found", f"{shown!r} does not exist") from None
        except OSError as exc:
            raise RequestError("read_failed", f"cannot read {shown!r}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise RequestError("is_directory", f"{shown!r} is a directory, not a file")
            if not stat.S_ISREG(st.st_mode):
                raise RequestError("not_a_file", f"{shown!r} is not a regular file")
            size = st.st_size
            if size > max_size:
                raise RequestError(
                    "too_large", f"{shown!r} is {size} bytes, over the limit of {max_size} bytes"
                )
            os.set_blocking(fd, True)
            wire.send_control(conn, {"size": size})
            remaining = size
            while remaining:
                chunk = os.read(fd, min(wire.DATA_CHUNK, remaining))
                if not chunk:
                    wire.send_control(
                        conn, {"error": f"{shown!r} shrank while being read", "code": "changed"}
                    )
                    return
                wire.send_frame(conn, wire.DATA, chunk)
                remaining -= len(chunk)
            wire.send_frame(conn, wire.EOF)
        finally:
            os.close(fd)


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


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# --- exec --------------------------------------------------------------------------------


class _ExecSpec:
    __slots__ = ("argv", "cwd", "env", "heartbeat", "stdin", "timeout")

    def __init__(
        self,
        *,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        stdin: bool,
        timeout: float | None,
        heartbeat: float | None,
    ) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.stdin, self.timeout, self.heartbeat = stdin, timeout, heartbeat

    @classmethod
    def from_request(
        cls, request: dict[str, Any], workspace: str, base_env: dict[str, str]
    ) -> _ExecSpec:
        argv = request.get("argv")
        if (
            not isinstance(argv, list)
            or not argv
            or not all(isinstance(a, str) and "\x00" not in a for a in argv)
        ):
            raise RequestError("bad_request", "argv must be a non-empty list of strings")
        env_in = request.get("env") or {}
        if not isinstance(env_in, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v
            for k, v in env_in.items()
        ):
            raise RequestError("bad_request", "env must map variable names to strings")
        cwd = request.get("cwd") or workspace
        if not isinstance(cwd, str) or "\x00" in cwd:
            raise RequestError("bad_request", "cwd must be a string")
        cwd = os.path.join(workspace, cwd)
        if not os.path.isdir(cwd):
            raise RequestError("bad_cwd", f"working directory {cwd!r} does not exist")
        timeout = request.get("timeout")
        if timeout is not None and not (wire.is_finite_number(timeout) and timeout > 0):
            raise RequestError("bad_request", "timeout must be a positive number of seconds")
        heartbeat = request.get("heartbeat")
        if heartbeat is not None and not (wire.is_finite_number(heartbeat) and heartbeat > 0):
            raise RequestError("bad_request", "heartbeat must be a positive number of seconds")
        return cls(
            argv=argv,
            env={**base_env, **env_in},
            cwd=cwd,
            stdin=bool(request.get("stdin")),
            timeout=timeout,
            heartbeat=heartbeat,
        )


class _ExecRun:
    """One command: a single-threaded selector loop over the output pipes, the stdin pipe,
    the host connection (kill, stdin, hang-up) and the child's exit, so nothing is polled."""

    def __init__(self, conn: socket.socket, spec: _ExecSpec) -> None:
        self.conn = conn
        self.spec = spec
        self.host_alive = True
        self.timed_out = False
        self.pending_stdin: collections.deque[memoryview] = collections.deque()
        self.stdin_eof = False

    def run(self) -> None:
        spec = self.spec
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                spec.argv,
                stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=spec.env,
                cwd=spec.cwd,
                start_new_session=True,
                bufsize=0,
            )
        except OSError as exc:
            raise RequestError(
                "spawn_failed", f"cannot run {spec.argv[0]!r}: {exc.strerror or exc}"
            ) from None
        self.proc = proc
        try:
            returncode = self._loop(started)
        finally:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        if not self.host_alive:
            return
        result = {
            "exit_code": returncode if returncode >= 0 else None,
            "signal": -returncode if returncode < 0 else None,
            "timed_out": self.timed_out,
            "duration": round(time.monotonic() - started, 6),
        }
        with contextlib.suppress(OSError):
            wire.send_control(self.conn, result)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _exit_fd(self, sel: selectors.BaseSelector) -> Callable[[], None]:
        """Register something readable once the child exits: a pidfd, or else a pipe written
        by a thread blocked in wait(). Returns its cleanup."""
        proc = self.proc
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pidfd = -1
        if pidfd >= 0:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
            return lambda: os.close(pidfd)
        r, w = os.pipe()

        def wait_then_signal() -> None:
            proc.wait()
            os.write(w, b"x")

        threading.Thread(target=wait_then_signal, daemon=True).start()
        sel.register(r, selectors.EVENT_READ, "exit")

        def cleanup() -> None:
            os.close(r)
            os.close(w)

        return cleanup

    def _send(self, ftype: int, payload: bytes | bytearray | memoryview) -> None:
        if not self.host_alive:
            return
        try:
            wire.send_frame(self.conn, ftype, payload)
        except OSError:
            self._host_gone()

    def _host_gone(self) -> None:
        self.host_alive = False
        self.kill_group()

    def _loop(self, started: float) -> int:
        spec, proc = self.spec, self.proc
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        streams = {proc.stdout.fileno(): wire.STDOUT, proc.stderr.fileno(): wire.STDERR}
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ, "out")
        sel.register(self.conn, selectors.EVENT_READ, "host")
        close_exit_fd = self._exit_fd(sel)
        stdin_fd = -1
        if proc.stdin is not None:
            stdin_fd = proc.stdin.fileno()
            os.set_blocking(stdin_fd, False)
        deadline = started + spec.timeout if spec.timeout is not None else None
        last_send = started
        returncode: int | None = None
        exited_at = 0.0
        try:
            while streams or returncode is None:
                now = time.monotonic()
                waits = []
                if spec.heartbeat is not None and self.host_alive:
                    waits.append(last_send + spec.heartbeat - now)
                if deadline is not None and returncode is None and not self.timed_out:
                    waits.append(deadline - now)
                if returncode is not None:
                    waits.append(exited_at + DRAIN_GRACE - now)
                timeout = max(0.0, min(waits)) if waits else None
                for key, _ in sel.select(timeout):
                    kind = key.data
                    if kind == "out":
                        fd = key.fd
                        try:
                            data = os.read(fd, OUTPUT_CHUNK)
                        except OSError:
                            data = b""
                        if data:
                            self._send(streams[fd], data)
                            last_send = time.monotonic()
                        else:
                            sel.unregister(fd)
                            del streams[fd]
                    elif kind == "host":
                        self._on_host(sel, stdin_fd)
                    elif kind == "stdin":
                        self._feed_stdin(sel, stdin_fd)
                    elif kind == "exit":
                        sel.unregister(key.fd)
                        returncode = proc.wait()
                        exited_at = time.monotonic()
                now = time.monotonic()
                expired = deadline is not None and now >= deadline
                if expired and returncode is None and not self.timed_out:
                    self.timed_out = True
                    self.kill_group()
                if returncode is not None and streams and now >= exited_at + DRAIN_GRACE:
                    break  # something outlived the command and holds its output open
                if spec.heartbeat is not None and now >= last_send + spec.heartbeat:
                    self._send(wire.CONTROL, wire.encode_control({"keepalive": True}))
                    last_send = now
        finally:
            sel.close()
            close_exit_fd()
            if returncode is None:  # only on an unexpected error: leave nothing running
                self.kill_group()
                returncode = proc.wait()
        return returncode

    def _on_host(self, sel: selectors.BaseSelector, stdin_fd: int) -> None:
        try:
            ftype, payload = wire.recv_frame(self.conn)
        except (OSError, EOFError, wire.ProtocolError):
            sel.unregister(self.conn)
            self._host_gone()
            return
        if ftype == wire.CONTROL:
            try:
                message = wire.decode_control(payload)
            except wire.ProtocolError:
                return
            if message.get("op") == "kill":
                self.kill_group()
        elif ftype == wire.STDIN and stdin_fd >= 0 and not self.stdin_eof:
            if payload:
                if not self.pending_stdin:
                    sel.register(stdin_fd, selectors.EVENT_WRITE, "stdin")
                self.pending_stdin.append(memoryview(payload))
        elif ftype == wire.EOF and stdin_fd >= 0 and not self.stdin_eof:
            self.stdin_eof = True
            if not self.pending_stdin:
                self._close_stdin()

    def _feed_stdin(self, sel: selectors.BaseSelector, stdin_fd: int) -> None:
        pending = self.pending_stdin
        try:
            while pending:
                n = os.write(stdin_fd, pending[0])
                if n < len(pending[0]):
                    pending[0] = pending[0][n:]
                    return
                pending.popleft()
        except BlockingIOError:
            return
        except OSError:  # the command closed its stdin: discard the rest
            pending.clear()
            self.stdin_eof = True
        sel.unregister(stdin_fd)
        if self.stdin_eof:
            self._close_stdin()

    def _close_stdin(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


# --- the way out: 127.0.0.1:3128 -> the host's egress proxy ------------------------------


class Forwarder:
    """Listens on 127.0.0.1:3128 in the guest; each accepted connection gets its own
    connection to the host's egress proxy and a thread copying bytes both ways (half-closes
    passed on). Nothing is parsed here: the host's proxy is where every decision is made."""

    def __init__(self, upstream: Endpoint, address: tuple[str, int] = FORWARDER_ADDRESS):
        self.upstream = upstream
        self.listener = socket.create_server(address, backlog=128)
        self.address = self.listener.getsockname()

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="egress-forwarder", daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)  # out of descriptors: let other connections finish
                    continue
                log(f"egress forwarder stopped: {exc}")
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.socket(self.upstream.family, socket.SOCK_STREAM)
        try:
            upstream.settimeout(CONNECT_TIMEOUT)
            upstream.connect(self.upstream.address)
            upstream.settimeout(None)
        except OSError:
            # The host's proxy is unreachable: the guest sees a closed connection.
            client.close()
            upstream.close()
            return
        peers = {client: upstream, upstream: client}
        open_reads = {client, upstream}
        buf = bytearray(FORWARDER_CHUNK)
        try:
            with selectors.DefaultSelector() as sel:
                for sock in open_reads:
                    sel.register(sock, selectors.EVENT_READ)
                while open_reads:
                    for key, _ in sel.select():
                        src: socket.socket = key.fileobj  # type: ignore[assignment]
                        try:
                            n = src.recv_into(buf)
                        except OSError:
                            n = 0
                        if n:
                            peers[src].sendall(memoryview(buf)[:n])
                            continue
                        sel.unregister(src)
                        open_reads.discard(src)
                        with contextlib.suppress(OSError):
                            peers[src].shutdown(socket.SHUT_WR)
        except OSError:
            pass  # either side reset: drop both
        finally:
            client.close()
            upstream.close()


# --- pid 1 -------------------------------------------------------------------------------

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8


def _mount(source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
    import ctypes  # only pid 1 in a Firecracker guest needs it

    if os.path.ismount(target):
        return
    os.makedirs(target, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(
        source.encode(), target.encode(), fstype.encode(), ctypes.c_ulong(flags), data.encode()
    )
    if rc != 0:
        err = ctypes.get_errno()
        if err != errno.EBUSY:
            raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def init_system(hostname: str) -> None:
    """What a container runtime would otherwise have done for us."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755")
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    _mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    socket.sethostname(hostname)


def run_as_pid1(agent_main: Callable[[], int]) -> int:
    """Fork: the child is the agent; this process stays pid 1, reaps every orphan that is
    re-parented to it, forwards SIGTERM/SIGINT to the agent, and exits with its status."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            code = agent_main()
        finally:
            os._exit(code)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


# --- entry point -------------------------------------------------------------------------


USAGE = (
    "usage: aamp-agent --connect unix:/path|vsock:CID:PORT [--egress ENDPOINT] "
    "[--workspace DIR] [--retry-seconds N] [--init] [--hostname NAME]"
)


class UsageError(ValueError):
    pass


def parse_args(argv: list[str]) -> dict[str, Any]:
    """The agent's few options (argparse would cost start-up time in the guest, see above)."""
    opts: dict[str, Any] = {
        "connect": None,
        "egress": None,
        "workspace": DEFAULT_WORKSPACE,
        "retry_seconds": 10.0,
        "init": False,
        "hostname": "sandbox",
    }
    takes_value = {"--connect", "--egress", "--workspace", "--retry-seconds", "--hostname"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        if name == "--init" and not eq:
            opts["init"] = True
        elif name in takes_value:
            if eq:
                value = inline
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise UsageError(f"{name} needs a value")
            key = name[2:].replace("-", "_")
            if key == "retry_seconds":
                try:
                    value = float(value)
                except ValueError:
                    raise UsageError(f"--retry-seconds must be a number, got {value!r}") from None
            opts[key] = value
        else:
            raise UsageError(f"unknown argument {arg!r}")
        i += 1
    if not opts["connect"]:
        raise UsageError("--connect is required")
    return opts


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
                Forwarder(egress).start()
            except OSError as exc:
                log(f"cannot listen on {FORWARDER_ADDRESS[0]}:{FORWARDER_ADDRESS[1]}: {exc}")
                return 1
            base_env.update(PROXY_ENV)
        return Agent(endpoint, args["workspace"], args["retry_seconds"], base_env).run()

    if os.getpid() == 1:
        return run_as_pid1(agent_main)
    return agent_main()
