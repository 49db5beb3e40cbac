"""Assembles the host process from settings: image store, drivers, sandbox manager, API."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from aamp.api.app import create_app
from aamp.api.auth import ensure_token
from aamp.config import Settings
from aamp.sandbox.drivers import available_drivers, choose_default_driver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import SandboxManager

log = logging.getLogger("aamp")


def parse_pool(spec: str) -> dict[str, int]:
    """`AAMP_WARM_POOL="base=2,browser=1"` -> {"base": 2, "browser": 1}."""
    pool: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, count = item.partition("=")
        if not sep or not count.isdigit() or not name:
            raise ValueError(f"AAMP_WARM_POOL item {item!r} must look like IMAGE=COUNT")
        pool[name] = int(count)
    return pool


def build_manager(settings: Settings) -> tuple[SandboxManager, ImageStore]:
    images = ImageStore(settings)
    drivers = available_drivers(settings)
    if not drivers:
        raise SystemExit("no isolation driver works on this host; run `aamp doctor` to see why")
    default = choose_default_driver(settings, drivers)
    pool = parse_pool(settings.env.get("AAMP_WARM_POOL", ""))
    return SandboxManager(settings, images, drivers, default, warm_pool=pool), images


def serve(settings: Settings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    manager, images = build_manager(settings)
    token = ensure_token(settings.cli_token_path)
    app = create_app(manager, images, token)
    print(
        f"aamp control plane on {settings.api_url} (drivers: {', '.join(sorted(manager.drivers))};"
        f" default {manager.default_driver}); API token in {settings.cli_token_path}",
        flush=True,
    )
    config = uvicorn.Config(
        app,
        host=settings.listen_host,
        port=settings.listen_port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    asyncio.run(uvicorn.Server(config).serve())
