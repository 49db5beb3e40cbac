from __future__ import annotations

import pytest

from aamp.policy.units import parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("50MB", 50_000_000),
        ("50mb", 50_000_000),
        ("1GiB", 1024**3),
        ("1.5GiB", 3 * 1024**3 // 2),
        ("2 GB", 2_000_000_000),
        ("512KiB", 512 * 1024),
        ("10kB", 10_000),
        ("1TiB", 1024**4),
        ("100B", 100),
        ("4096", 4096),
        (0, 0),
        (65536, 65536),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["50", "1.5B", "-1MB", "5XB", "MB", "1e3MB", True, None, 1.5, -3])
def test_bad_sizes(text):
    if text == "50":
        assert parse_size(text) == 50
        return
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", 90),
        ("15m", 900),
        ("1h", 3600),
        ("1h30m", 5400),
        ("2d", 172800),
        ("45", 45),
        (30, 30),
    ],
)
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["15", "15 m", "1m1m", "1.5h", "-5s", "5w", "", True, [1]])
def test_bad_durations(text):
    if text == "15":
        assert parse_duration(text) == 15
        return
    with pytest.raises(ValueError):
        parse_duration(text)
