"""Exports are JSON lines that verify offline; tampering with the file is detected."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from audit_helpers import append_many

from aamp.audit import (
    AuditLog,
    CheckpointSigner,
    ExportFormatError,
    export,
    verify_export,
)
from aamp.store import Store

N = 30


@pytest.fixture
async def exported(store: Store, tmp_path: Path) -> tuple[Path, CheckpointSigner]:
    signer = CheckpointSigner.generate()
    async with AuditLog(store, signer, checkpoint_every=10) as log:
        await append_many(log, N, tasks=3)
    path = tmp_path / "audit.jsonl"
    with path.open("w", encoding="utf-8") as out:
        assert export(store, out, public_keys=signer.trusted_keys()) == N
    return path, signer


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def _write(path: Path, objs: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs), "utf-8")


def test_export_verifies_offline(exported: tuple[Path, CheckpointSigner]) -> None:
    path, signer = exported
    objs = _lines(path)
    assert objs[0]["kind"] == "header" and objs[-1]["kind"] == "end"
    records = [o for o in objs if o["kind"] == "record"]
    assert [r["seq"] for r in records] == list(range(1, N + 1))
    assert {
        "actor",
        "action",
        "resource",
        "decision",
        "reason",
        "request_id",
        "time",
        "details",
        "hash",
        "prev_hash",
    } <= set(records[0])
    report = verify_export(path, signer.trusted_keys())
    assert report.ok and report.records == N and report.checkpoints == 3, report.summary()
    untrusted = verify_export(path)
    assert untrusted.ok and untrusted.note is not None
    foreign = verify_export(path, CheckpointSigner.generate().trusted_keys())
    assert foreign.problem is not None and foreign.problem.kind == "checkpoint"


async def test_export_since_a_seq_or_a_time(store: Store, tmp_path: Path) -> None:
    signer = CheckpointSigner.generate()
    async with AuditLog(store, signer, checkpoint_every=10) as log:
        await append_many(log, 12)
        middle = datetime.now(UTC)
        await append_many(log, 5, prefix="late")
    out = tmp_path / "since.jsonl"
    with out.open("w") as fh:
        assert export(store, fh, since=8) == 10
    report = verify_export(out, signer.trusted_keys())
    assert report.ok and (report.first_seq, report.last_seq) == (8, 17)
    with out.open("w") as fh:
        assert export(store, fh, since=middle) == 5
    assert verify_export(out, signer.trusted_keys()).first_seq == 13
    with out.open("w") as fh:
        assert export(store, fh, since=middle + timedelta(days=1)) == 0
    assert verify_export(out, signer.trusted_keys()).ok


def _edit(objs: list[dict[str, object]], seq: int, **changes: object) -> None:
    for o in objs:
        if o["kind"] == "record" and o["seq"] == seq:
            o.update(changes)


@pytest.mark.parametrize(
    ("change", "seq", "kind"),
    [
        (lambda objs: _edit(objs, 6, actor="user:mallory"), 6, "edited"),
        (lambda objs: _edit(objs, 9, details={"exit": 0}), 9, "edited"),
        (
            lambda objs: objs.pop(next(i for i, o in enumerate(objs) if o.get("seq") == 14)),
            14,
            "removed",
        ),
        (lambda objs: objs.__setitem__(slice(3, 5), [objs[4], objs[3]]), 3, "removed"),
        (lambda objs: objs.pop(), 31, "removed"),
        (lambda objs: objs.__delitem__(slice(-5, None)), 28, "removed"),
    ],
    ids=["actor", "details", "delete-line", "swap-lines", "drop-end", "cut-tail"],
)
def test_export_tampering_is_detected(
    exported: tuple[Path, CheckpointSigner],
    change,
    seq: int,
    kind: str,  # type: ignore[no-untyped-def]
) -> None:
    path, signer = exported
    objs = _lines(path)
    change(objs)
    _write(path, objs)
    report = verify_export(path, signer.trusted_keys())
    assert report.problem is not None, "tampering went unnoticed"
    assert (report.problem.seq, report.problem.kind) == (seq, kind), report.summary()


def test_not_an_export_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"kind":"record"}\n')
    with pytest.raises(ExportFormatError, match="line 1 is not an aamp-audit-export/1 header"):
        verify_export(bad)
    bad.write_text("not json\n")
    with pytest.raises(ExportFormatError, match="line 1 is not JSON"):
        verify_export(bad)
