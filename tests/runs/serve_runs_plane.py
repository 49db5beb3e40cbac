"""Child process for the run kill -9 test: a real control plane on loopback with gVisor and the
built images. Usage: python serve_runs_plane.py HOME RUNTIME_DIR IMAGE_DIR PORT"""

from __future__ import annotations

import asyncio
import sys

import uvicorn

from aamp.api.app import create_app
from aamp.config import Settings
from aamp.sandbox.gvisor import GVisorDriver
from aamp.server import build_control_plane


def main(home: str, runtime: str, images: str, port: int) -> None:
    settings = Settings.from_env(
        {
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
