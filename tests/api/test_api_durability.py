"""kill -9 of the server during 1,000 concurrent audited API requests: every request the API
answered has its audit record (the guard's decision is durable before the route runs), and
the chain verifies."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import text

from aamp.audit import CheckpointSigner, verify
from aamp.config import Settings
from aamp.store import Store

CHILD = Path(__file__).with_name("serve_plane.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _hammer(base: str, token: str, proc: subprocess.Popen[bytes]) -> dict[str, int]:
    acked: dict[str, int] = {}
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as c:

        async def one(i: int) -> None:
            rid = f"kill-{i:06d}"
            try:
                resp = await c.get(
                    "/v1/me", headers={"authorization": f"Bearer {token}", "x-request-id": rid}
                )
            except httpx.HTTPError:
                return
            if resp.status_code == 200:
                acked[rid] = i

        async def killer() -> None:
            while len(acked) < 300:
                await asyncio.sleep(0.001)
            os.kill(proc.pid, signal.SIGKILL)

        kill_task = asyncio.create_task(killer())
        await asyncio.gather(*(one(i) for i in range(1000)))
        kill_task.cancel()
    return acked


def test_kill_9_during_1000_requests_loses_no_acknowledged_record(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runsc") is None:
        import pytest

        pytest.skip("the control plane needs root and runsc here")
    home, runtime, port = tmp_path / "home", f"/run/aamp-t{secrets.token_hex(4)}", _port()
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(home), runtime, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
            try:
                if httpx.get(f"{base}/v1/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        token = (home / "cli-token").read_text().strip()
        acked = asyncio.run(_hammer(base, token, proc))
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(runtime, ignore_errors=True)
    assert proc.returncode == -signal.SIGKILL
    assert 300 <= len(acked) < 1000, len(acked)

    settings = Settings(home=home, runtime_dir=tmp_path / "run", image_dir=tmp_path / "img")
    with Store.open(settings) as store:
        with store.engine.connect() as conn:
            recorded = set(
                conn.execute(
                    text("SELECT request_id FROM audit_records WHERE action = 'me.read'")
                ).scalars()
            )
        missing = sorted(set(acked) - recorded)
        assert missing == [], f"acknowledged requests without a record: {missing[:10]}"
        report = verify(store, CheckpointSigner.load(home / "audit-signing.key").trusted_keys())
        assert report.ok, report.summary()
