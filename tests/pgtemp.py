"""A throwaway PostgreSQL server, for the test suite and `benchmarks/`, never for production.

It runs the real server from the Debian `postgresql` package: `initdb` into a fresh temporary
directory, `pg_ctl start` listening on a free loopback port (and a socket in that directory),
trust authentication for the local `postgres` role, and `stop()` removes everything. The
server refuses to run as root, so as root it runs as the `postgres` system user the package
creates.

Usage::

    with TemporaryPostgres() as pg:
        store = Store.from_url(pg.url("aamp_test"))
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy.engine import URL


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here; the message says what to install."""


def find_bindir() -> Path:
    """The directory with `initdb`, `pg_ctl` and `postgres` (newest installed version)."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise PostgresUnavailable(
        "PostgreSQL server binaries not found; install them with `apt-get install -y postgresql`"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TemporaryPostgres:
    def __init__(self) -> None:
        self.bindir = find_bindir()
        self.port = _free_port()
        self._root = Path(tempfile.mkdtemp(prefix="aamp-pg-"))
        self.datadir = self._root / "data"
        self.sockdir = self._root
        self._user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "running as root needs the `postgres` system user (package postgresql)"
                ) from None
            os.chown(self._root, self._user.pw_uid, self._user.pw_gid)
        self._started = False

    def _run(self, *args: str) -> None:
        kwargs: dict[str, object] = {}
        if self._user is not None:
            kwargs = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            env=env,
            cwd=self._root,
            **kwargs,  # type: ignore[arg-type]
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{Path(args[0]).name} failed ({proc.returncode}): {proc.stderr or proc.stdout}"
            )

    def start(self) -> TemporaryPostgres:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.sockdir} -c max_connections=200 "
            "-c shared_buffers=64MB"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-l",
            str(self._root / "server.log"),
            "-o",
            opts,
            "-w",
            "-t",
            "60",
            "start",
        )
        self._started = True
        return self

    def url(self, database: str = "postgres") -> URL:
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            host="127.0.0.1",
            port=self.port,
            database=database,
        )

    def create_database(self, name: str) -> URL:
        """A new empty database on this server; returns its URL."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # name comes from the caller's code
        return self.url(name)

    def stop(self) -> None:
        if self._started:
            self._started = False
            try:
                self._run(
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                )
            finally:
                shutil.rmtree(self._root, ignore_errors=True)
        else:
            shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> TemporaryPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
