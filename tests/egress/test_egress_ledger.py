from __future__ import annotations

import asyncio
import json

import pytest

from aamp.egress.ledger import EgressEvent, JsonLinesSink


def _event(i: int) -> EgressEvent:
    return EgressEvent(
        sandbox_id="sb-000000000001",
        time=1700000000.0 + i,
        connection=i,
        kind="connect",
        host="a.test",
        port=443,
        address="127.0.0.10",
        decision="allowed",
        rule="allow[0] a.test",
        reason="a.test:443 is allowed by allow[0] a.test",
        status=200,
        bytes_up=i,
        bytes_down=2 * i,
        duration=0.5,
    )


async def test_json_lines_sink_keeps_every_concurrent_event(tmp_path, monkeypatch):
    synced = []
    sink = JsonLinesSink(tmp_path / "egress.jsonl")
    real_append = sink._append
    monkeypatch.setattr(sink, "_append", lambda data: (synced.append(data), real_append(data)))
    await asyncio.gather(*(sink.record(_event(i)) for i in range(300)))
    lines = (tmp_path / "egress.jsonl").read_text().splitlines()
    assert len(lines) == 300
    assert sorted(json.loads(line)["connection"] for line in lines) == list(range(300))
    assert sink.read()[0] == _event(0)
    assert len(synced) < 300  # group commit: concurrent events share fsyncs
    assert oct((tmp_path / "egress.jsonl").stat().st_mode & 0o777) == "0o600"


async def test_sink_error_reaches_the_caller(tmp_path):
    sink = JsonLinesSink(tmp_path / "missing-dir" / "egress.jsonl")
    with pytest.raises(OSError):
        await sink.record(_event(1))
