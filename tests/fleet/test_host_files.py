"""The host's store of read-only files (`aamp.fleet.host_files.HostFiles`), on its own: a file
is kept only when held and its bytes hash to its name, lives as long as a hold or a sandbox
needs it, and goes at once after; start-up (`clear`) leaves nothing; each refusal is
recorded (`host.file_refused`, deny) before it is raised."""

from __future__ import annotations

import hashlib
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aamp.fleet.host_files import HOLD_SECONDS, FileRefused, HostFiles

DATA = b"an index's bytes " * 1000
SHA = hashlib.sha256(DATA).hexdigest()
HOLD, OTHER = "a" * 32, "b" * 32


class Records:
    """The host's recorder (its `LogRecorder`), keeping what it is given."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    async def record(self, **fields: object) -> None:
        self.events.append(fields)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _chunks(data: bytes, size: int = 4096) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


def _store(tmp_path: Path, **kw: object) -> tuple[HostFiles, Records, Clock]:
    records, clock = Records(), Clock()
    files = HostFiles(tmp_path / "host-files", records, clock=clock, **kw)  # type: ignore[arg-type]
    files.clear()
    return files, records, clock


def _kept(files: HostFiles) -> list[str]:
    return sorted(p.name for p in files.root.iterdir())


async def test_a_file_lives_while_a_sandbox_uses_it_and_goes_after(tmp_path: Path) -> None:
    files, records, _ = _store(tmp_path)
    assert await files.hold(SHA, len(DATA), HOLD) is False  # not here yet
    await files.put(SHA, HOLD, len(DATA), _chunks(DATA))
    path = files.path(SHA)
    assert path.read_bytes() == DATA
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert await files.claim(HOLD, [SHA]) == [path]
    files.attach(HOLD, "sb-000000000001")
    # A second create holds it: it is there already, nothing is sent again.
    assert await files.hold(SHA, len(DATA), OTHER) is True
    assert await files.claim(OTHER, [SHA]) == [path]
    files.attach(OTHER, "sb-000000000002")
    files.sweep({"sb-000000000001", "sb-000000000002"})
    assert files.in_use() == {SHA: {"sb-000000000001", "sb-000000000002"}}
    files.sweep({"sb-000000000002"})  # one destroyed: the other still mounts it
    assert path.is_file()
    files.sweep(set())  # none uses it
    assert _kept(files) == []
    assert files.in_use() == {}
    assert records.events == []


async def test_a_failed_create_forgets_its_files_and_a_stale_hold_expires(tmp_path: Path) -> None:
    files, _, clock = _store(tmp_path)
    await files.hold(SHA, len(DATA), HOLD)
    await files.put(SHA, HOLD, len(DATA), _chunks(DATA))
    files.forget(HOLD)  # the create failed
    assert _kept(files) == []
    with pytest.raises(FileRefused):
        await files.claim(HOLD, [SHA])

    # A replica that held and sent, then never created (it died): kept until the hold ends.
    await files.hold(SHA, len(DATA), OTHER)
    await files.put(SHA, OTHER, len(DATA), _chunks(DATA))
    files.sweep(set())
    assert _kept(files) == [SHA]
    clock.now += HOLD_SECONDS + 1
    files.sweep(set())
    assert _kept(files) == []


async def test_start_up_clears_everything_an_earlier_process_kept(tmp_path: Path) -> None:
    files, _, _ = _store(tmp_path)
    await files.hold(SHA, len(DATA), HOLD)
    await files.put(SHA, HOLD, len(DATA), _chunks(DATA))
    files.attach(HOLD, "sb-000000000001")
    (files.root / f".{SHA}.0123456789ab.part").write_bytes(b"half an upload")
    again, _, _ = _store(tmp_path)  # the host started again (or its epoch was stale)
    assert _kept(again) == []
    assert again.in_use() == {}


async def test_what_is_not_the_held_file_is_refused_recorded_and_not_kept(tmp_path: Path) -> None:
    files, records, _ = _store(tmp_path, max_bytes=len(DATA))
    # Bytes that do not hash to the name they are sent under.
    await files.hold(SHA, len(DATA), HOLD)
    wrong = DATA[:-1] + b"!"
    with pytest.raises(FileRefused) as refused:
        await files.put(SHA, HOLD, len(wrong), _chunks(wrong))
    assert refused.value.status == 422 and "hash to" in str(refused.value)
    assert _kept(files) == []  # no partial upload either
    # More bytes than announced.
    with pytest.raises(FileRefused):
        await files.put(SHA, HOLD, len(DATA), _chunks(DATA + b"more"))
    # Over the size bound, or a size unlike the hold's.
    with pytest.raises(FileRefused) as refused:
        await files.hold(SHA, len(DATA) + 1, HOLD)
    assert refused.value.status == 413
    with pytest.raises(FileRefused):
        await files.put(SHA, HOLD, len(DATA) - 1, _chunks(DATA[:-1]))
    # Unknown: a file no create holds, a name that is no SHA-256, a bad hold id.
    with pytest.raises(FileRefused) as refused:
        await files.put(SHA, OTHER, len(DATA), _chunks(DATA))
    assert refused.value.status == 404
    with pytest.raises(FileRefused):
        await files.hold("../../etc/passwd", 10, HOLD)
    with pytest.raises(FileRefused):
        await files.hold(SHA, 10, "not-a-hold")
    # Claimed but never sent.
    with pytest.raises(FileRefused):
        await files.claim(HOLD, [SHA])
    assert _kept(files) == []
    assert len(records.events) == 8
    assert {e["action"] for e in records.events} == {"host.file_refused"}
    assert {e["decision"] for e in records.events} == {"deny"}
    assert "hash to" in str(records.events[0]["reason"])
