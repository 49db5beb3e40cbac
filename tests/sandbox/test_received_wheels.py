"""The wheels a sandbox host is sent over the link (`received_wheels.py`): an offer names
what is lacking; a wheel is kept under its SHA-256 only when its bytes hash to it, are the
size announced and at most the bound, and make a readable wheel — each other case refused
with nothing left on disk; a kept wheel is found again by its reference."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from wheel_files import make_wheel  # noqa: E402  (tests/wheel_files.py)

from aamp.sandbox import received_wheels  # noqa: E402
from aamp.sandbox.received_wheels import ReceivedWheels, WheelRef, WheelRefused  # noqa: E402


async def _chunks(data: bytes, size: int = 7) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _wheel(tmp_path: Path) -> tuple[WheelRef, bytes]:
    path = make_wheel(tmp_path, "aamprecv", "1.0", "X = 1\n")
    data = path.read_bytes()
    return WheelRef(hashlib.sha256(data).hexdigest(), path.name), data


def _left(store: ReceivedWheels) -> list[Path]:
    return sorted(store.root.rglob("*")) if store.root.exists() else []


def test_an_offer_names_what_is_lacking_and_a_kept_wheel_is_found(tmp_path: Path) -> None:
    ref, data = _wheel(tmp_path)
    store = ReceivedWheels(tmp_path / "home")
    assert store.lacking([ref]) == [ref.sha256]
    with pytest.raises(WheelRefused, match=r"not sent the wheels aamprecv-1\.0"):
        store.paths([ref])
    kept = asyncio.run(store.keep(ref, _chunks(data), len(data)))
    assert kept == tmp_path / "home" / "link-wheels" / ref.sha256 / ref.filename
    assert kept.read_bytes() == data
    assert store.lacking([ref]) == []
    assert store.paths([ref]) == [(kept, ref.sha256)]
    # Sent again (two creates at once): the same bytes, kept once, nothing else on disk.
    asyncio.run(store.keep(ref, _chunks(data), len(data)))
    assert _left(store) == [kept.parent, kept]


def test_bytes_that_do_not_hash_to_the_offer_are_refused_and_not_kept(tmp_path: Path) -> None:
    ref, _ = _wheel(tmp_path)
    store = ReceivedWheels(tmp_path / "home")
    (tmp_path / "other").mkdir()
    swapped = make_wheel(tmp_path / "other", "aamprecv", "1.0", "X = 2\n").read_bytes()
    with pytest.raises(WheelRefused, match=r"hash to .* not the SHA-256 it was offered as") as e:
        asyncio.run(store.keep(ref, _chunks(swapped), len(swapped)))
    assert e.value.status == 400
    assert _left(store) == []  # no file, no directory for it
    assert store.lacking([ref]) == [ref.sha256]


def test_too_large_announced_or_sent_is_refused(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ref, data = _wheel(tmp_path)
    store = ReceivedWheels(tmp_path / "home")
    with pytest.raises(WheelRefused, match="bytes announced; a wheel is 1 to") as e:
        asyncio.run(store.keep(ref, _chunks(data), received_wheels.MAX_WHEEL_BYTES + 1))
    assert e.value.status == 413
    # More sent than announced: refused as it arrives, never more on disk than announced.
    with pytest.raises(WheelRefused, match="more than 10 bytes sent") as e:
        asyncio.run(store.keep(ref, _chunks(data), 10))
    assert e.value.status == 413
    with pytest.raises(WheelRefused, match=r"bytes sent, .* announced"):
        asyncio.run(store.keep(ref, _chunks(data), len(data) + 5))
    monkeypatch.setattr(received_wheels, "MAX_WHEEL_BYTES", len(data) - 1)
    with pytest.raises(WheelRefused, match="bytes announced"):
        asyncio.run(store.keep(ref, _chunks(data), len(data)))
    assert _left(store) == []


def test_what_is_not_a_wheel_is_refused_even_with_its_hash(tmp_path: Path) -> None:
    junk = b"not a zip file at all"
    ref = WheelRef(hashlib.sha256(junk).hexdigest(), "aamprecv-1.0-py3-none-any.whl")
    store = ReceivedWheels(tmp_path / "home")
    with pytest.raises(WheelRefused, match="not a readable wheel"):
        asyncio.run(store.keep(ref, _chunks(junk), len(junk)))
    assert _left(store) == []


@pytest.mark.parametrize(
    ("offered", "why"),
    [
        ([{"sha256": "0" * 63, "filename": "a-1-py3-none-any.whl"}], "not a SHA-256"),
        ([{"sha256": "0" * 64, "filename": "../a-1-py3-none-any.whl"}], "not a wheel file"),
        ([{"sha256": "0" * 64, "filename": "a-1-cp39-cp39-win_amd64.whl"}], "cannot use"),
        ([{"sha256": "0" * 64, "filename": "a-1-py3-none-any.whl", "x": 1}], "sha256 and"),
        ({"sha256": "0" * 64}, "is a list"),
        ([{"sha256": "0" * 64, "filename": "a-1-py3-none-any.whl"}] * 257, "is a list"),
    ],
)
def test_an_offer_that_is_not_wheels_by_hash_is_refused(offered: object, why: str) -> None:
    with pytest.raises(WheelRefused, match=why):
        WheelRef.listed(offered)
