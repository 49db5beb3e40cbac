"""Shared fixtures: per-test installation settings, and the guest images built once a session
where `scripts/install` put them (see install_layout.py), so the suite reuses them."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop
from install_layout import shared_home
from installation_settings import make_settings, shared_env

from aamp.config import Settings


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict:
    """Every async test on the event loop `aamp up` and `aamp host serve` run (uvloop)."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    s = make_settings(tmp_path / "home")
    yield s
    shutil.rmtree(s.runtime_dir, ignore_errors=True)


def _need_root_and_runsc() -> None:
    if os.geteuid() != 0:
        pytest.skip("gVisor sandboxes need root here")
    if shutil.which("runsc") is None:
        pytest.skip("runsc is not installed (Debian package runsc); scripts/install adds it")


def _build(name: str) -> object:
    _need_root_and_runsc()
    from aamp.egress.ca import InstallationCA, ca_dir
    from aamp.sandbox.images import ImageStore

    # Built as `scripts/install` builds them, with the installation's CA baked in.
    shared = Settings.from_env({**shared_env(), "AAMP_HOME": str(shared_home())})
    ca = InstallationCA.load_or_create(ca_dir(shared))

    def progress(line: str) -> None:
        print(line, file=sys.stderr)

    return ImageStore(shared).build(name, progress=progress, ca_cert=ca.cert_path)


@pytest.fixture(scope="session")
def shared_ca_dir() -> Path:
    """Where the CA baked into the test images lives (tests that intercept TLS use it)."""
    return shared_home() / "ca"


@pytest.fixture(scope="session")
def base_image() -> object:
    return _build("base")


@pytest.fixture(scope="session")
def browser_image() -> object:
    return _build("browser")


@pytest.fixture(scope="session")
def docs_image() -> object:
    return _build("docs")


@pytest.fixture(scope="session")
def rag_image() -> object:
    return _build("rag")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    """One real PostgreSQL server for the whole run, started from Debian's binaries."""
    from pgtemp import TemporaryPostgres

    with TemporaryPostgres() as pg:
        yield pg


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store test runs on a SQLite file and on a fresh database of the real server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/aamp.db"
    pg = request.getfixturevalue("postgres_server")
    url = pg.create_database(f"t_{uuid.uuid4().hex[:12]}")
    return url.render_as_string(hide_password=False)
