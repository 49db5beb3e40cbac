"""What this installation itself listens on: places no egress rule can open.

A sandbox must never reach the control plane that contains it. Yet a rule for a name that
resolves to this host (`llm.internal`, a DNS name for 127.0.0.1) without a port opens every
port there, and the API's `/v1/health` with it. So, whatever the rules say, the proxy refuses
to connect to any address of *this host* on a port the installation serves:

- the API listener (`Settings.listen_host` / `listen_port`, i.e. `AAMP_HOST` / `AAMP_PORT`);
- every listener another aamp process announced under `$AAMP_HOME/listeners/` while it runs —
  `aamp model serve` (the local model server) does, see `announce`.

"This host" is judged by the kernel, not by a list of spellings: an address is local when it
is loopback or unspecified (`0.0.0.0` and `::` connect to this host), or when a socket can be
bound to it (then it is one of this host's own addresses, on any interface — which is what a
listener on `0.0.0.0`/`::` answers on). IPv4 carried in IPv6 (`::ffff:127.0.0.1`) is judged
by the IPv4 address inside. The match is by port on every local address, whichever address
the listener bound: that refuses a little more than strictly needed and leaves no spelling of
"this host" to get wrong.

The sockets in the runtime directory (guest channels, egress sockets) are Unix sockets: the
proxy only ever opens TCP connections to IP addresses, so they are never a destination.

`InstallationListeners` is built where the proxies are (`server.build_manager`, or from the
manager's own settings) and handed to each proxy; nothing here is global.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from aamp.config import Settings
from aamp.policy.addresses import IPAddress, unwrap

log = logging.getLogger("aamp.egress")
ANNOUNCED_DIR = "listeners"
# Announcements are read again when the directory changes, and at least this often (a
# change within the file system's timestamp granularity could otherwise go unseen).
REREAD_SECONDS = 1.0


@dataclass(frozen=True)
class Listener:
    """One thing the installation serves: `what` it is (for the refusal), where it listens."""

    what: str
    host: str
    port: int

    def describe(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.what} ({host}:{self.port})"


def listeners_dir(home: Path) -> Path:
    """Where running aamp processes announce what they listen on."""
    return home / ANNOUNCED_DIR


def is_local(address: IPAddress) -> bool:
    """Whether connecting to `address` reaches this host (see the module docstring)."""
    effective = unwrap(address)
    if effective.is_loopback or effective.is_unspecified:
        return True
    family = socket.AF_INET6 if effective.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(effective), 0))
    except OSError as exc:
        # Only "not an address of this host" means not local; any other failure (no free
        # port, no descriptors) must not open the installation: count it as local.
        return exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EINVAL)
    return True


class InstallationListeners:
    """The installation's own listeners; `serving(address, port)` says which one (if any) a
    connection to that address and port would reach."""

    def __init__(self, listeners: Iterable[Listener] = (), *, announced: Path | None = None):
        self._fixed = tuple(listeners)
        self._announced_dir = announced
        self._announced: tuple[Listener, ...] = ()
        self._announced_stamp: int | None = None
        self._announced_at = 0.0

    @classmethod
    def of(cls, settings: Settings) -> InstallationListeners:
        """The API listener of `settings`, and whatever is announced under its home."""
        api = Listener("the control plane's API", settings.listen_host, settings.listen_port)
        return cls([api], announced=listeners_dir(settings.home))

    def __repr__(self) -> str:
        return f"InstallationListeners({[x.describe() for x in self.all()]})"

    def all(self) -> tuple[Listener, ...]:
        return self._fixed + self._current_announced()

    def serving(self, address: IPAddress, port: int) -> Listener | None:
        if not self._fixed and self._announced_dir is None:
            return None  # a proxy outside any installation (tests, tools)
        for listener in self.all():
            if listener.port == port and is_local(address):
                return listener
        return None

    def _current_announced(self) -> tuple[Listener, ...]:
        directory = self._announced_dir
        if directory is None:
            return ()
        try:
            stamp = directory.stat().st_mtime_ns  # changes whenever a file comes or goes
        except FileNotFoundError:
            self._announced, self._announced_stamp = (), None
            return ()
        now = time.monotonic()
        if stamp != self._announced_stamp or now - self._announced_at > REREAD_SECONDS:
            self._announced = tuple(_read_announced(directory))
            self._announced_stamp, self._announced_at = stamp, now
        return self._announced


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_announced(directory: Path) -> Iterator[Listener]:
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            listener = Listener(str(data["what"]), str(data["host"]), int(data["port"]))
            pid = int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable listener announcement %s: %s", path, exc)
            continue
        if not 1 <= listener.port <= 65535:
            continue
        if _alive(pid):  # a process killed with -9 leaves its file behind
            yield listener


@contextlib.contextmanager
def announce(directory: Path, listener: Listener) -> Iterator[Path]:
    """Announce `listener` while the block runs (this process's pid), so that every egress
    proxy of the installation refuses it. The file is removed on the way out."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in directory.glob("*.json"):  # left by processes that were killed
        pid = stale.name.split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
    path = directory / f"{os.getpid()}-{listener.port}.json"
    record = {"what": listener.what, "host": listener.host, "port": listener.port}
    tmp = directory / f".{path.name}.tmp"  # not *.json: never read half-written
    tmp.write_text(json.dumps({**record, "pid": os.getpid()}), encoding="utf-8")
    os.replace(tmp, path)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
