"""One command the host asked for, run in the guest: its request checked (`ExecSpec`), then run
in its own session with output streamed as it comes and the whole process group killed on a
``kill``, the timeout or the host hanging up (`ExecRun`)."""

from __future__ import annotations

import collections
import contextlib
import os
import selectors
import signal
import socket
import subprocess
import threading
import time

from aamp.guest import wire
from aamp.guest.errors import RequestError

TYPE_CHECKING = False  # typing is not imported at run time (see `aamp.guest.agent`)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
OUTPUT_CHUNK = 64 * 1024
# After the command exits, output still in flight is read for this long; a background
# process that keeps the pipes open must not hold the exec open forever.
DRAIN_GRACE = 0.5


class ExecSpec:
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
    ) -> ExecSpec:
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


class ExecRun:
    """One command: a single-threaded selector loop over the output pipes, the stdin pipe,
    the host connection (kill, stdin, hang-up) and the child's exit, so nothing is polled."""

    def __init__(self, conn: socket.socket, spec: ExecSpec) -> None:
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
