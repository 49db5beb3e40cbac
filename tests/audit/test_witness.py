"""Removing the newest records is detected: the head is signed within seconds while records
arrive, every signed head is also kept in the witness file, and `verify` names what is gone."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from audit_helpers import (
    append_many,
    checkpoint_seqs,
    head_seq,
    truncate_tail,
    wait_until,
    witness_seqs,
)
from sqlalchemy import text

from aamp.audit import WITNESS_FILENAME, AuditLog, CheckpointSigner, WitnessReader, verify
from aamp.audit.checkpointer import SECONDS_ENV
from aamp.audit.forward import FORWARD_ENV
from aamp.config import ConfigError, Settings
from aamp.store import Store


def _witness(settings: Settings) -> Path:
    return settings.home / WITNESS_FILENAME


def _verify(store: Store, signer: CheckpointSigner, path: Path):  # type: ignore[no-untyped-def]
    keys = signer.trusted_keys()
    return verify(store, keys, witness=WitnessReader(path, keys))


async def _thirty(settings: Settings, store: Store) -> CheckpointSigner:
    """30 records, checkpoints at 10, 20 and (at close) 30, all witnessed."""
    async with AuditLog.open(settings, store, checkpoint_every=10) as log:
        await append_many(log, 30, tasks=4)
    assert witness_seqs(_witness(settings)) == [10, 20, 30]
    return log.signer


async def test_the_head_is_signed_within_seconds_while_records_arrive(
    settings: Settings, store: Store
) -> None:
    interval = 0.3
    log = AuditLog.open(settings, store, checkpoint_seconds=interval)
    async with log:
        await append_many(log, 5)
        # No count-based checkpoint is due (every 10,000): only the time basis signs this.
        await wait_until(lambda: checkpoint_seqs(store)[-1:] == [5], "the head (5) is signed")
        await wait_until(lambda: witness_seqs(_witness(settings))[-1:] == [5], "5 witnessed")
        quiet = checkpoint_seqs(store)
        # Nothing is signed while no record arrives (three intervals of quiet).
        await asyncio.sleep(3 * interval)
        assert checkpoint_seqs(store) == quiet
        # While records keep arriving, a checkpoint at most once per interval.
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < 4 * interval:
            await append_many(log, 3)
        elapsed = loop.time() - started
        signed_while_busy = len(checkpoint_seqs(store)) - len(quiet)
        assert 1 <= signed_while_busy <= elapsed / interval + 1, (signed_while_busy, elapsed)
        head = head_seq(store)
        await wait_until(lambda: witness_seqs(_witness(settings))[-1] == head, "head witnessed")
    assert _verify(store, log.signer, _witness(settings)).ok


async def test_truncating_the_tail_fails_verify_naming_the_range(
    settings: Settings, store: Store
) -> None:
    signer = await _thirty(settings, store)
    truncate_tail(store, 22)
    # The database alone cannot tell: this is the hole the witness closes.
    assert verify(store, signer.trusted_keys()).ok
    report = _verify(store, signer, _witness(settings))
    assert report.problem is not None, report.summary()
    assert (report.problem.seq, report.problem.kind) == (23, "removed"), report.summary()
    assert "records 23..30 are missing" in report.problem.message
    assert "witness file says record 30" in report.problem.message
    assert report.summary().startswith("FAILED at record 23 (removed)")


async def test_records_written_again_over_a_cut_tail_do_not_match_the_witness(
    settings: Settings, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    signer = await _thirty(settings, store)
    truncate_tail(store, 22)
    async with AuditLog.open(settings, store, checkpoint_every=10) as log:
        # The restart signs head 22; the witness already holds 30, and the log says so.
        assert "audit head 22 not witnessed: the witness already holds record 30" in caplog.text
        await append_many(log, 15, prefix="again")
    assert head_seq(store) == 37
    assert verify(store, signer.trusted_keys()).ok  # a consistent, newly signed chain
    # The witness kept its high-water mark (the restart's head, 22, was not newer).
    assert witness_seqs(_witness(settings)) == [10, 20, 30, 37]
    report = _verify(store, signer, _witness(settings))
    assert report.problem is not None, report.summary()
    assert (report.problem.seq, report.problem.kind) == (30, "witness_mismatch"), report.summary()
    assert "record 30 does not match the witness" in report.problem.message


async def test_an_intact_chain_verifies_against_its_witness(
    settings: Settings, store: Store
) -> None:
    signer = await _thirty(settings, store)
    report = _verify(store, signer, _witness(settings))
    assert report.ok, report.summary()
    assert report.witnessed_seq == 30
    assert "the witnessed head at record 30 matches" in report.summary()


def _cut_mid_line(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-10])


def _edit_last_hash(path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    obj = json.loads(lines[-1])
    obj["hash"] = "0" * 64
    lines[-1] = json.dumps(obj, separators=(",", ":")) + "\n"
    path.write_text("".join(lines))


def _swap_lines(path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[1], lines[2] = lines[2], lines[1]
    path.write_text("".join(lines))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_cut_mid_line, "damaged at line 3: the line is cut off"),
        (_edit_last_hash, "damaged at line 3: the signature for record 30 is invalid"),
        (
            lambda p: p.write_text(p.read_text() + "garbage\n"),
            "damaged at line 4: the line is not JSON",
        ),
        (_swap_lines, "damaged at line 3: record 20 follows record 30"),
        (
            lambda p: p.write_text(p.read_text().replace('"seq":20', '"seq":"20"')),
            "damaged at line 2: seq is not a record number",
        ),
        (lambda p: p.unlink(), "does not exist, but the chain holds records"),
    ],
    ids=["cut-mid-line", "edited", "garbage", "swapped", "seq-type", "removed"],
)
async def test_a_damaged_witness_is_reported_as_such(
    settings: Settings, store: Store, damage: Callable[[Path], object], words: str
) -> None:
    signer = await _thirty(settings, store)
    damage(_witness(settings))
    report = _verify(store, signer, _witness(settings))
    assert report.problem is not None, report.summary()
    assert report.problem.kind == "witness_damaged", report.summary()
    assert words in report.problem.message
    assert str(_witness(settings)) in report.problem.message


async def test_damage_in_the_chain_comes_first_and_the_witness_damage_is_noted(
    settings: Settings, store: Store
) -> None:
    signer = await _thirty(settings, store)
    _cut_mid_line(_witness(settings))
    truncate_tail(store, 15)  # before checkpoint 20: the intact lines still name the range
    report = _verify(store, signer, _witness(settings))
    assert report.problem is not None
    assert (report.problem.seq, report.problem.kind) == (16, "removed"), report.summary()
    assert "records 16..20 are missing" in report.problem.message
    assert report.note is not None and "cut off" in report.note


async def test_a_damaged_line_hides_no_later_line(settings: Settings, store: Store) -> None:
    signer = await _thirty(settings, store)
    path = _witness(settings)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "{}\n" + lines[1] + "x" * 100_000 + "\n" + lines[2])
    truncate_tail(store, 22)
    report = _verify(store, signer, path)
    assert report.problem is not None
    assert (report.problem.seq, report.problem.kind) == (23, "removed"), report.summary()
    assert "records 23..30 are missing" in report.problem.message
    assert report.note is not None
    assert "damaged at line 2: the line is not an object with exactly" in report.note
    path.write_text(lines[0] + lines[1] + "x" * 100_000 + "\n" + lines[2])
    report = _verify(store, signer, path)
    assert report.problem is not None and "records 23..30" in report.problem.message
    assert report.note is not None
    assert "damaged at line 3: the line is longer than 4096 bytes" in report.note


async def test_a_planted_checkpoint_row_at_the_head_is_not_witnessed(
    settings: Settings, store: Store
) -> None:
    """Someone with database write access signs the head first, with a bad signature: the
    host witnesses its own signature instead (a witness line must never be damaged by them)."""
    log = AuditLog.open(settings, store, checkpoint_seconds=3600)
    async with log:
        await append_many(log, 5)
        with store.write_connection() as conn:
            conn.execute(
                text(
                    "INSERT INTO audit_checkpoints (seq, hash, time, key_id, signature) SELECT "
                    "seq, hash, time, :k, :s FROM audit_records WHERE seq = 5"
                ),
                {"k": log.signer.key_id, "s": "00" * 64},
            )
        assert await log.checkpoint() == 5
    keys = log.signer.trusted_keys()
    reader = WitnessReader(_witness(settings), keys)
    report = verify(store, keys, witness=reader)
    assert witness_seqs(_witness(settings)) == [5]
    assert reader.damage is None and reader.lines == 1
    assert report.problem is not None and (report.problem.seq, report.problem.kind) == (
        5,
        "checkpoint",
    )
    assert "invalid signature" in report.problem.message


async def test_lines_cut_from_the_witness_end_are_reported_once_they_are_old(
    settings: Settings, store: Store
) -> None:
    signer = await _thirty(settings, store)
    path = _witness(settings)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))  # 10, 20
    # Just signed (a host may be writing it right now): not yet evidence of a cut.
    assert _verify(store, signer, path).ok
    with store.write_connection() as conn:  # checkpoint 30 as if signed an hour ago
        conn.execute(text("UPDATE audit_checkpoints SET time = '2020-01-01T00:00:00.000000Z'"))
    report = _verify(store, signer, path)
    assert report.problem is not None and report.problem.kind == "witness_damaged"
    assert "ends at record 20" in report.problem.message
    assert "signed checkpoint at record 30" in report.problem.message


async def test_a_forwarded_copy_still_names_what_a_local_attacker_hid(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    """Database and file-system access: the local witness can be cut to match; the
    forwarded copy cannot be."""
    siem = tmp_path / "siem" / "aamp-witness.log"
    siem.parent.mkdir()
    forwarding = settings.replace(env={**settings.env, FORWARD_ENV: f"file:{siem}"})
    signer = await _thirty(forwarding, store)
    assert siem.read_bytes() == _witness(settings).read_bytes()
    truncate_tail(store, 12)
    local = _witness(settings)
    local.write_text("".join(local.read_text().splitlines(keepends=True)[:1]))  # only 10
    assert _verify(store, signer, local).ok  # locally, the cut is hidden
    report = _verify(store, signer, siem)
    assert report.problem is not None, report.summary()
    assert (report.problem.seq, report.problem.kind) == (13, "removed")
    assert "records 13..30 are missing" in report.problem.message


async def test_witness_lines_are_forwarded_to_syslog(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "log.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as daemon:
        daemon.bind(str(path))
        daemon.settimeout(5)
        forwarding = settings.replace(env={**settings.env, FORWARD_ENV: f"syslog:{path}"})
        await _thirty(forwarding, store)
        messages = [daemon.recv(4096) for _ in range(3)]
    lines = _witness(settings).read_bytes().splitlines()
    prefix = f"<37>aamp-audit-witness[{os.getpid()}]: ".encode()
    assert messages == [prefix + line for line in lines]


async def test_a_forward_that_fails_later_loses_nothing_locally(
    settings: Settings, store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "log.sock"
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    daemon.bind(str(path))
    forwarding = settings.replace(env={**settings.env, FORWARD_ENV: f"syslog:{path}"})
    log = AuditLog.open(forwarding, store)
    async with log:
        daemon.close()  # the syslog daemon goes away
        await append_many(log, 3)
        assert await log.checkpoint() == 3
        assert witness_seqs(_witness(settings)) == [3]
        assert "not forwarded to syslog:" in caplog.text
        daemon = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path.unlink()
        daemon.bind(str(path))  # and comes back
        await append_many(log, 2)
        assert await log.checkpoint() == 5
    with daemon:
        daemon.settimeout(5)
        assert b'"seq":5,' in daemon.recv(4096)
    assert "works again; 1 line(s) were not forwarded" in caplog.text
    assert witness_seqs(_witness(settings)) == [3, 5]


def _bad_forwards(settings: Settings, tmp_path: Path) -> list[tuple[str, str]]:
    listener_gone = tmp_path / "gone.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(listener_gone))
    plain = tmp_path / "plain.txt"
    plain.write_text("")
    return [
        ("udp://10.0.0.1:514", "must be file:/PATH or syslog:/SOCKET"),
        ("file", "must be file:/PATH or syslog:/SOCKET"),
        ("file:relative/siem.log", "is not an absolute path"),
        (f"file:{tmp_path}/no/such/dir/siem.log", "does not exist"),
        (f"file:{tmp_path}", "is a directory"),
        (f"file:{settings.home / WITNESS_FILENAME}", "is the witness file itself"),
        (f"syslog:{tmp_path}/nothing.sock", "No such file"),
        (f"syslog:{plain}", "is not a socket"),
        (f"syslog:{listener_gone}", "does not take datagrams"),
    ]


async def test_bad_settings_are_refused_when_the_log_opens(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    for value, words in _bad_forwards(settings, tmp_path):
        bad = settings.replace(env={**settings.env, FORWARD_ENV: value})
        with pytest.raises(ConfigError, match=FORWARD_ENV) as caught:
            AuditLog.open(bad, store)
        assert words in str(caught.value), (value, str(caught.value))
    for value in ("0", "-1", "1.5", "five", "3601"):
        bad = settings.replace(env={**settings.env, SECONDS_ENV: value})
        with pytest.raises(ConfigError, match=f"{SECONDS_ENV} must be a whole number"):
            AuditLog.open(bad, store)
    assert not _witness(settings).exists()
    good = settings.replace(env={**settings.env, SECONDS_ENV: "2"})
    assert AuditLog.open(good, store).batching.checkpoint_seconds == 2
    assert AuditLog.open(settings, store).batching.checkpoint_seconds == 5


def test_aamp_up_refuses_a_bad_forward(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AAMP_HOME": str(tmp_path / "home"),
        "AAMP_RUNTIME_DIR": str(tmp_path / "run"),
        FORWARD_ENV: "syslog",
    }
    env.pop("AAMP_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "aamp", "up"], env=env, capture_output=True, timeout=120
    )
    assert done.returncode != 0
    assert f"aamp: {FORWARD_ENV} must be file:/PATH or syslog:/SOCKET".encode() in done.stderr


def _aamp(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings.env, "AAMP_HOME": str(settings.home)}
    return subprocess.run(
        [sys.executable, "-m", "aamp", *args], env=env, capture_output=True, text=True, timeout=120
    )


async def test_the_cli_names_the_missing_range(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    await _thirty(settings, store)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(_witness(settings).read_bytes())
    ok = _aamp(settings, "audit", "verify")
    assert ok.returncode == 0 and ok.stdout.startswith("OK"), ok
    assert "the witnessed head at record 30 matches" in ok.stdout
    truncate_tail(store, 25)
    _witness(settings).write_text("")  # cut locally too; the copy elsewhere remains
    cut = _aamp(settings, "audit", "verify", "--witness", str(copy))
    assert cut.returncode == 1, cut
    assert cut.stdout.startswith("FAILED at record 26 (removed): records 26..30 are missing")
    missing = _aamp(settings, "audit", "verify", "--witness", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "no such file" in missing.stderr


async def test_a_head_signed_before_an_older_checkpoint_is_witnessed_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer committed a checkpoint at 20 that the time basis has not yet witnessed when
    `sign_now` signs the head at 30: the witness gets 20, then 30, and raises no alarm."""
    from aamp.audit.chain import Checkpoint
    from aamp.audit.checkpointer import Checkpointer
    from aamp.audit.witness import WitnessFile

    def checkpoint(seq: int) -> Checkpoint:
        return Checkpoint(seq, f"{seq:064x}", "k", "s", time="2026-12-01T00:00:00Z")

    witness = WitnessFile(tmp_path / WITNESS_FILENAME)
    witness.create()

    async def sign_head() -> Checkpoint:
        return checkpoint(30)

    async def append(cp: Checkpoint) -> None:
        await asyncio.to_thread(witness.append, cp)

    checkpointer = Checkpointer(sign_head, append, seconds=60)
    checkpointer.start()
    checkpointer.records_committed([checkpoint(20)])
    with caplog.at_level("WARNING", logger="aamp.audit"):
        assert (await checkpointer.sign_now()).seq == 30
        await checkpointer.stop()
    assert witness_seqs(tmp_path / WITNESS_FILENAME) == [20, 30]
    assert "not witnessed" not in caplog.text
