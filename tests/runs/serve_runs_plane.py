"""Child process for the run kill -9 tests: a real control plane on loopback with gVisor and the
built images. Usage: python serve_runs_plane.py HOME RUNTIME_DIR IMAGE_DIR PORT

The store, fleet and lease settings (`PASSED`) come from the environment, so that two of these
can be replicas on one PostgreSQL database."""

from __future__ import annotations

import asyncio
import os
import sys

import uvicorn

from aamp.api.app import create_app
from aamp.config import Settings
from aamp.sandbox.gvisor import GVisorDriver
from aamp.server import build_control_plane

PASSED = (
    "AAMP_DATABASE_URL",
    "AAMP_FLEET_HOST_ID",
    "AAMP_FLEET_HEARTBEAT_SECONDS",
    "AAMP_FLEET_LOST_SECONDS",
    "AAMP_RUN_LEASE_SECONDS",
    "AAMP_FLEET_LINK_LISTEN",
)


def main(home: str, runtime: str, images: str, port: int) -> None:
    settings = Settings.from_env(
        {
            **{name: os.environ[name] for name in PASSED if name in os.environ},
            "AAMP_HOME": home,
            "AAMP_RUNTIME_DIR": runtime,
            "AAMP_IMAGE_DIR": images,
            "AAMP_ADMIN_PASSWORD": "admin-password-for-tests",
        }
    )
    cp, _ = build_control_plane(settings, {"gvisor": GVisorDriver(settings.runtime_dir)})
    config = uvicorn.Config(
        create_app(cp), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
