"""Fixtures for the client's tests: `serve(script)` starts a `ScriptedHttpServerForTests`."""

from __future__ import annotations

import pytest
from scripted_http import Script, ScriptedHttpServerForTests


@pytest.fixture
def serve():
    servers: list[ScriptedHttpServerForTests] = []

    def start(script: Script) -> ScriptedHttpServerForTests:
        servers.append(ScriptedHttpServerForTests(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
