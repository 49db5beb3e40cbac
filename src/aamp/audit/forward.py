"""Forwarding each witness line, as it is written, to where this host cannot take it back.

`AAMP_AUDIT_WITNESS_FORWARD` (unset or empty: no forwarding):

- `file:/ABSOLUTE/PATH` — each line is appended to that file and fsynced: a file a SIEM
  collects, best on storage this host cannot rewrite (a remote mount, an append-only volume).
  Created 0600 if missing. The lines are the witness file's own, so
  `aamp audit verify --witness PATH` checks the chain against it.
- `syslog:/ABSOLUTE/SOCKET` — each line is one message to the local syslog daemon's Unix
  datagram socket (usually `syslog:/dev/log`), facility `auth`, severity `notice`, tag
  `aamp-audit-witness`; the message text is the line. The daemon relays it to the SIEM.

The value is checked when the audit log is opened, so `aamp up` refuses to start with a bad
one: the form, an absolute path, a file that can be appended to and is not the witness itself,
a socket that takes a datagram connection. A line that cannot be forwarded later is logged as
an error (the local witness has it); the next line is tried again, and the first one that gets
through logs how many did not.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path

from aamp.config import ConfigError

FORWARD_ENV = "AAMP_AUDIT_WITNESS_FORWARD"
SYSLOG_PRIORITY = 4 * 8 + 5  # facility auth (4), severity notice (5)
SYSLOG_TAG = "aamp-audit-witness"

log = logging.getLogger(__name__)


def write_all(fd: int, data: bytes) -> None:
    """`os.write` until all of `data` is written (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class WitnessForward(ABC):
    """Where witness lines also go; `send` never raises (a failure is logged)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.failed = 0  # lines not forwarded since the last one that was

    def send(self, line: bytes) -> None:
        try:
            self._deliver(line)
        except OSError as exc:
            self.failed += 1
            log.error(
                "audit witness line not forwarded to %s (%s); the local witness has it",
                self.target,
                exc,
            )
            return
        if self.failed:
            log.warning(
                "audit witness forwarding to %s works again; %d line(s) were not forwarded",
                self.target,
                self.failed,
            )
            self.failed = 0

    @abstractmethod
    def _deliver(self, line: bytes) -> None:
        """Hand `line` over durably; raise OSError if it was not."""


class FileForward(WitnessForward):
    def __init__(self, path: Path) -> None:
        super().__init__(f"file:{path}")
        self.path = path

    def _deliver(self, line: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


class SyslogForward(WitnessForward):
    def __init__(self, socket_path: Path) -> None:
        super().__init__(f"syslog:{socket_path}")
        self.socket_path = socket_path

    def _deliver(self, line: bytes) -> None:
        header = f"<{SYSLOG_PRIORITY}>{SYSLOG_TAG}[{os.getpid()}]: ".encode("ascii")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(str(self.socket_path))
            sock.send(header + line.rstrip(b"\n"))


def forward_from_env(env: Mapping[str, str], witness_path: Path) -> WitnessForward | None:
    """The forward `AAMP_AUDIT_WITNESS_FORWARD` asks for, checked; ConfigError names the rule."""
    raw = (env.get(FORWARD_ENV) or "").strip()
    if not raw:
        return None
    kind, sep, target = raw.partition(":")
    if not sep or kind not in ("file", "syslog"):
        raise ConfigError(
            f"{FORWARD_ENV} must be file:/PATH or syslog:/SOCKET (e.g. syslog:/dev/log), "
            f"got {raw!r}"
        )
    path = Path(target)
    if not path.is_absolute():
        raise ConfigError(f"{FORWARD_ENV}: {target!r} is not an absolute path")
    if kind == "file":
        return _checked_file(path, witness_path)
    return _checked_syslog(path)


def _checked_file(path: Path, witness_path: Path) -> FileForward:
    if path.resolve() == witness_path.resolve():
        raise ConfigError(f"{FORWARD_ENV}: {path} is the witness file itself")
    if path.is_dir():
        raise ConfigError(f"{FORWARD_ENV}: {path} is a directory, not a file")
    if not path.parent.is_dir():
        raise ConfigError(f"{FORWARD_ENV}: the directory {path.parent} does not exist")
    try:
        FileForward(path)._deliver(b"")  # opens (creates) it for appending, writes nothing
    except OSError as exc:
        raise ConfigError(f"{FORWARD_ENV}: {path} cannot be appended to: {exc}") from None
    return FileForward(path)


def _checked_syslog(path: Path) -> SyslogForward:
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{FORWARD_ENV}: syslog socket {path}: {exc}") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"{FORWARD_ENV}: {path} is not a socket")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(str(path))
    except OSError as exc:
        raise ConfigError(
            f"{FORWARD_ENV}: {path} does not take datagrams (is the syslog daemon running?): {exc}"
        ) from None
    return SyslogForward(path)
