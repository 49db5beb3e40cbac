"""Times as stored: an epoch clock's seconds become the same fixed-width UTC text as an aware
datetime does, so leases, heartbeats and login throttles compare with every other stored time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from aamp.store import format_time, parse_time, time_at


def test_an_epoch_time_is_stored_as_its_utc_text() -> None:
    assert time_at(0) == "1970-01-01T00:00:00.000000Z"
    assert time_at(1.5) == "1970-01-01T00:00:01.500000Z"
    moment = datetime(2026, 12, 1, 21, 4, 5, 6, tzinfo=timezone(timedelta(hours=2)))
    assert time_at(moment.timestamp()) == format_time(moment) == "2026-12-01T19:04:05.000006Z"
    assert parse_time(time_at(moment.timestamp())) == moment.astimezone(UTC)
