"""Schemathesis against the OpenAPI document of a real server on loopback (uvicorn in a
thread), as the admin: no 500s, responses match the schema, content types as documented.

Examples per operation are bounded (AAMP_FUZZ_EXAMPLES, default 15) to keep it under 3 min.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
import uvicorn
from api_plane import plane_drivers, plane_settings  # tests/api/conftest.py
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from aamp.api.app import create_app
from aamp.server import build_control_plane

EXAMPLES = int(os.environ.get("AAMP_FUZZ_EXAMPLES", "15"))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path):
    cfg = plane_settings(tmp_path)
    cp, _ = build_control_plane(cfg, plane_drivers(cfg))
    app = create_app(cp)
    port = _port()
    srv = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve()), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/v1/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    token = cfg.cli_token_path.read_text().strip()
    yield base, token, app
    srv.should_exit = True
    thread.join(timeout=30)
    cp.store.close()


@pytest.mark.slow
def test_fuzz_finds_no_server_errors_or_schema_violations(server) -> None:
    base, token, app = server
    schema = schemathesis.openapi.from_dict(app.openapi())
    headers = {"authorization": f"Bearer {token}"}
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path == "/v1/tokens/{token_id}" and operation.method.upper() == "DELETE":
            continue  # fuzzing could revoke the very token the fuzzer uses
        if operation.path == "/v1/wheelhouse" and operation.method.upper() == "POST":
            continue  # it would send made-up package names to the package index (pip)

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case) -> None:  # type: ignore[no-untyped-def]
            case.call_and_validate(base_url=base, headers=headers, checks=checks)

        try:
            run()
        except Exception as exc:  # collect every operation's failure, then report them all
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}"[:2000])
    assert failures == [], "\n\n".join(failures)
