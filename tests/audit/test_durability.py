"""kill -9 during 1,000 concurrent appends loses no acknowledged record; the chain verifies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from aamp.audit import CheckpointSigner, verify
from aamp.config import Settings
from aamp.store import Store

CHILD = Path(__file__).with_name("kill_appender.py")


def test_kill_9_loses_no_acknowledged_record(settings: Settings, database_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), database_url, str(settings.home), "1000"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    acked: dict[int, str] = {}
    try:
        assert proc.stdout.readline().strip() == "ready"
        while len(acked) < 300:
            line = proc.stdout.readline()
            assert line, "the appender exited before being killed"
            seq, rid = line.split()
            acked[int(seq)] = rid
        os.kill(proc.pid, signal.SIGKILL)
        # Lines already written before the kill were acknowledged too.
        for line in proc.stdout:
            if line.strip():
                seq, rid = line.split()
                acked[int(seq)] = rid
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    with Store.open(settings) as store:
        with store.engine.connect() as conn:
            stored = dict(conn.execute(text("SELECT seq, request_id FROM audit_records")).all())
        missing = {s: r for s, r in acked.items() if stored.get(s) != r}
        assert missing == {}, f"acknowledged records lost: {sorted(missing)[:10]}"
        signer = CheckpointSigner.load(settings.home / "audit-signing.key")
        report = verify(store, signer.trusted_keys())
        assert report.ok, report.summary()
        assert report.records >= len(acked) >= 300
        assert len(acked) < 1000, "the kill came after every append had finished"
