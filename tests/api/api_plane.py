"""Helpers for an in-process control plane (real store, audit log, vault and sandbox manager).

Two kinds, chosen by the settings a test builds:
- `plane_settings`: a plane that boots nothing. Its image directory is empty, so a sandbox
  request that gets past authorisation fails with "not built"; its driver is the
  `DriverDouble` (tests/driver_double.py) and its runtime directory lies under the test's
  tmp_path, so it runs on any machine, without root or runsc: routes, identity, secrets and
  the audit log can be tested cheaply everywhere.
- `booting_plane_settings`: the built images and the real gVisor driver (skipped where it
  cannot run), for tests that start sandboxes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from driver_double import DriverDouble  # tests/driver_double.py
from install_layout import shared_image_dir  # tests/install_layout.py
from sqlalchemy import text

from aamp.api.context import ControlPlane
from aamp.config import Settings
from aamp.sandbox.driver import Driver
from aamp.store.url import DATABASE_URL_ENV, SQLITE_FILENAME

ADMIN_PASSWORD = "admin-password-for-tests"


@dataclass
class Plane:
    cp: ControlPlane
    app: object
    admin_token: str

    def client(self, token: str | None = None, **kw: object) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),  # type: ignore[arg-type]
            base_url="http://testserver",
            headers=headers,
            **kw,  # type: ignore[arg-type]
        )

    def decision(self, request_id: str) -> str | None:
        """The guard's decision for a request: its first audit record."""
        with self.cp.store.engine.connect() as conn:
            return conn.execute(
                text(
                    "SELECT decision FROM audit_records WHERE request_id = :r ORDER BY seq LIMIT 1"
                ),
                {"r": request_id},
            ).scalar()

    async def runnable_agent(self, name: str, policy: dict[str, object]) -> str:
        """As admin: an agent granted `policy` (stored under its name) and the policy's image;
        returns the agent's id."""
        async with self.client(self.admin_token) as admin:
            agent = (await admin.post("/v1/agents", json={"name": name})).json()["id"]
            stored = await admin.put(f"/v1/policies/{policy['name']}", json=policy)
            assert stored.status_code == 200, stored.text
            for kind in ("policy", "image"):
                granted = policy["name" if kind == "policy" else "image"]
                r = await admin.post(
                    f"/v1/agents/{agent}/resources", json={"kind": kind, "name": granted}
                )
                assert r.status_code == 201, r.text
        return agent

    async def user(self, username: str, role: str, password: str | None = None) -> str:
        """Create a user as admin; returns an API token of theirs."""
        cp = self.cp
        await cp.store.run(
            lambda: cp.directory.create_user(
                username, role, password or f"{username}-password-1", by="test"
            )
        )
        _, secret = await cp.store.run(lambda: cp.directory.create_token(username, "t"))
        return secret


def plane_settings(tmp_path: Path, **extra: str) -> Settings:
    """A plane that boots nothing: no images, the DriverDouble, everything under tmp_path."""
    return Settings.from_env(
        {
            "AAMP_HOME": str(tmp_path / "home"),
            "AAMP_RUNTIME_DIR": str(tmp_path / "run"),
            "AAMP_IMAGE_DIR": str(tmp_path / "no-images"),
            "AAMP_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "AAMP_DRIVER": DriverDouble.name,
            **extra,
        }
    )


def booting_plane_settings(tmp_path: Path, **extra: str) -> Settings:
    """A plane that boots real gVisor sandboxes from the built images."""
    return plane_settings(
        tmp_path,
        # Short, in /run: the sandboxes' Unix socket paths must stay under 108 bytes.
        AAMP_RUNTIME_DIR=f"/run/aamp-t{secrets.token_hex(4)}",
        AAMP_IMAGE_DIR=str(shared_image_dir()),
        AAMP_DRIVER="gvisor",
        **extra,
    )


def gvisor_only(settings: Settings) -> dict[str, Driver]:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        pytest.skip("the sandbox manager needs root and runsc here")
    from aamp.sandbox.gvisor import GVisorDriver

    return {"gvisor": GVisorDriver(settings.runtime_dir)}


def plane_drivers(settings: Settings) -> dict[str, Driver]:
    """The driver the settings name: the DriverDouble, or the real gVisor driver."""
    if settings.env["AAMP_DRIVER"] == DriverDouble.name:
        return {DriverDouble.name: DriverDouble()}
    return gvisor_only(settings)


_MIGRATED: list[Path] = []  # this process's empty database at the newest schema, once made


def _migrated_database() -> Path:
    """An SQLite database the store's own migrations brought to the newest schema, made once a
    process: a plane's copy of it is what those migrations would make (the migrations
    themselves are tested in tests/store), without running them again for every plane."""
    if not _MIGRATED:
        from aamp.store import Store

        home = Path(tempfile.mkdtemp(prefix="aamp-migrated-"))
        atexit.register(shutil.rmtree, home, True)
        Store.open(Settings.from_env({"AAMP_HOME": str(home)})).close()
        _MIGRATED.append(home / SQLITE_FILENAME)
    return _MIGRATED[0]


def _start_from_migrated_database(settings: Settings) -> None:
    """Give a new SQLite installation the migrated empty database (a test that wrote its own,
    or that uses PostgreSQL, keeps it)."""
    database = settings.home / SQLITE_FILENAME
    if settings.env.get(DATABASE_URL_ENV) or database.exists():
        return
    settings.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.copy2(_migrated_database(), database)


@contextlib.asynccontextmanager
async def running_plane(settings: Settings) -> AsyncIterator[Plane]:
    """A control plane built from `settings`, its app started (lifespan), then torn down."""
    from aamp.api.app import create_app
    from aamp.server import build_control_plane

    _start_from_migrated_database(settings)
    drivers = plane_drivers(settings)
    cp, _ = build_control_plane(settings, drivers)
    app = create_app(cp)
    token = settings.cli_token_path.read_text().strip()
    try:
        async with app.router.lifespan_context(app):
            yield Plane(cp, app, token)
    finally:
        cp.store.close()
        shutil.rmtree(settings.runtime_dir, ignore_errors=True)
    double = drivers.get(DriverDouble.name)
    if isinstance(double, DriverDouble):
        assert double.create_attempts == [], (
            "a test on a plane that boots nothing tried to start a sandbox; "
            "give it booting_plane_settings"
        )


@contextlib.asynccontextmanager
async def running_replicas(
    tmp_path: Path, postgres_server: object, **extra: str
) -> AsyncIterator[tuple[Plane, Plane]]:
    """Two control-plane replicas of one installation on a new database of the real
    PostgreSQL server: the same $AAMP_HOME (replicas share the keys), each with its own
    runtime directory, sandbox manager, process state and own host (`replica-a`, `replica-b`)."""
    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")  # type: ignore[attr-defined]
    shared = {"AAMP_DATABASE_URL": url.render_as_string(hide_password=False), **extra}
    a_settings = plane_settings(tmp_path, AAMP_FLEET_HOST_ID="replica-a", **shared)
    b_settings = plane_settings(
        tmp_path, AAMP_RUNTIME_DIR=str(tmp_path / "run-b"), AAMP_FLEET_HOST_ID="replica-b", **shared
    )
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_plane(a_settings))
        b = await stack.enter_async_context(running_plane(b_settings))
        assert a.cp.store is not b.cp.store and a.cp.store.dialect == "postgresql"
        yield a, b
