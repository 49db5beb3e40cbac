"""kill -9 during 1,000 concurrent appends loses no acknowledged record; the chain verifies;
the tail the killed process left unsigned is signed when the log starts again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from audit_helpers import append_many, head_seq, truncate_tail, wait_until, witness_seqs
from sqlalchemy import text

from aamp.audit import WITNESS_FILENAME, AuditLog, CheckpointSigner, WitnessReader, verify
from aamp.config import Settings
from aamp.store import Store

CHILD = Path(__file__).with_name("kill_appender.py")


def _append_and_kill(settings: Settings, database_url: str) -> dict[int, str]:
    """Run the appender, kill -9 it mid-way; the records it acknowledged (seq: request id)."""
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
    assert len(acked) < 1000, "the kill came after every append had finished"
    return acked


def test_kill_9_loses_no_acknowledged_record(settings: Settings, database_url: str) -> None:
    acked = _append_and_kill(settings, database_url)
    with Store.open(settings) as store:
        with store.engine.connect() as conn:
            stored = dict(conn.execute(text("SELECT seq, request_id FROM audit_records")).all())
        missing = {s: r for s, r in acked.items() if stored.get(s) != r}
        assert missing == {}, f"acknowledged records lost: {sorted(missing)[:10]}"
        signer = CheckpointSigner.load(settings.home / "audit-signing.key")
        report = verify(store, signer.trusted_keys())
        assert report.ok, report.summary()
        assert report.records >= len(acked) >= 300


async def test_after_kill_9_the_tail_is_signed_at_restart_and_its_removal_is_named(
    settings: Settings, database_url: str
) -> None:
    _append_and_kill(settings, database_url)
    witness = settings.home / WITNESS_FILENAME
    with Store.open(settings) as store:
        killed_at = head_seq(store)  # past its last checkpoint (every 100), almost always
        log = AuditLog.open(settings, store, checkpoint_seconds=0.3)
        await log.start()
        try:
            # Recovery: the head the killed process left unsigned is signed and witnessed.
            assert witness_seqs(witness)[-1] == killed_at
            # And while records arrive, their head is signed within seconds (before close).
            await append_many(log, 7, prefix="after")
            await wait_until(
                lambda: witness_seqs(witness)[-1] == killed_at + 7, "the new head is witnessed"
            )
        finally:
            await log.close()
        keys = log.signer.trusted_keys()
        assert verify(store, keys, witness=WitnessReader(witness, keys)).ok
        truncate_tail(store, killed_at - 5)
        report = verify(store, keys, witness=WitnessReader(witness, keys))
        assert report.problem is not None, report.summary()
        assert report.problem.kind == "removed", report.summary()
        assert f"records {killed_at - 4}..{killed_at + 7} are missing" in report.problem.message
