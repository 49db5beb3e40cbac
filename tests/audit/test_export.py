"""Exports are JSON lines that verify offline; tampering with the file is detected."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from audit_helpers import append_many, truncate_tail, witness_seqs

from aamp.audit import (
    WITNESS_FILENAME,
    AuditLog,
    Batching,
    CheckpointSigner,
    ExportFormatError,
    WitnessReader,
    export,
    verify_export,
)
from aamp.config import Settings
from aamp.store import Store

N = 30


@pytest.fixture
async def exported(store: Store, tmp_path: Path) -> tuple[Path, CheckpointSigner]:
    signer = CheckpointSigner.generate()
    async with AuditLog(store, signer, batching=Batching(checkpoint_every=10)) as log:
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
    async with AuditLog(store, signer, batching=Batching(checkpoint_every=10)) as log:
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


def _export(store: Store, path: Path, signer: CheckpointSigner, **kwargs: object) -> None:
    with path.open("w", encoding="utf-8") as out:
        export(store, out, public_keys=signer.trusted_keys(), **kwargs)  # type: ignore[arg-type]


async def _witnessed(settings: Settings, store: Store) -> tuple[CheckpointSigner, Path]:
    async with AuditLog.open(settings, store, checkpoint_every=10) as log:
        await append_many(log, N, tasks=3)
    return log.signer, settings.home / WITNESS_FILENAME


async def _cut_and_exported(
    settings: Settings, store: Store, tmp_path: Path
) -> tuple[CheckpointSigner, Path, Path]:
    """30 witnessed records, the database cut back to 24, then exported."""
    signer, witness = await _witnessed(settings, store)
    truncate_tail(store, 24)
    path = tmp_path / "audit.jsonl"
    _export(store, path, signer)
    return signer, witness, path


async def test_an_export_of_a_cut_database_fails_against_the_witness(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    signer, witness, path = await _cut_and_exported(settings, store, tmp_path)
    keys = signer.trusted_keys()
    assert verify_export(path, keys).ok  # the file alone is consistent
    report = verify_export(path, keys, witness=WitnessReader(witness, keys))
    assert report.problem is not None, report.summary()
    assert (report.problem.seq, report.problem.kind) == (25, "removed"), report.summary()
    assert "records 25..30 are missing" in report.problem.message


async def test_heads_witnessed_after_the_export_are_not_expected_in_it(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    signer, witness = await _witnessed(settings, store)
    path = tmp_path / "audit.jsonl"
    _export(store, path, signer)
    async with AuditLog.open(settings, store, checkpoint_every=10) as log:
        await append_many(log, 12, prefix="later")
    assert witness_seqs(witness) == [10, 20, 30, 40, 42]
    keys = signer.trusted_keys()
    report = verify_export(path, keys, witness=WitnessReader(witness, keys))
    assert report.ok, report.summary()
    assert report.witnessed_seq == 30
    since = tmp_path / "since.jsonl"
    _export(store, since, signer, since=15)
    report = verify_export(since, keys, witness=WitnessReader(witness, keys))
    assert report.ok and report.witnessed_seq == 42, report.summary()


async def test_an_export_whose_records_were_written_again_does_not_match_the_witness(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    signer, witness = await _witnessed(settings, store)
    truncate_tail(store, 24)
    async with AuditLog.open(settings, store, checkpoint_every=10) as log:
        await append_many(log, 8, prefix="again")
    path = tmp_path / "audit.jsonl"
    _export(store, path, signer)
    keys = signer.trusted_keys()
    assert verify_export(path, keys).ok
    report = verify_export(path, keys, witness=WitnessReader(witness, keys))
    assert report.problem is not None, report.summary()
    assert (report.problem.seq, report.problem.kind) == (30, "witness_mismatch")


async def test_an_export_without_its_time_uses_the_witness_only_inside_it(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    signer, witness, path = await _cut_and_exported(settings, store, tmp_path)
    objs = _lines(path)
    del objs[0]["exported_at"]  # as written before exports carried it
    _write(path, objs)
    keys = signer.trusted_keys()
    report = verify_export(path, keys, witness=WitnessReader(witness, keys))
    assert report.ok and report.witnessed_seq == 20, report.summary()
    assert report.note is not None and "does not say when it was exported" in report.note
