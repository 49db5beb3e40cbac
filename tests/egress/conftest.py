from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from egress_netns import netns_available, run_in_netns

from aamp.egress.ledger import JsonLinesSink


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory for Unix sockets (paths are limited to 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="aamp-eg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sink(sockdir: Path) -> JsonLinesSink:
    """A real ledger file for the proxy under test (test modules may define their own)."""
    return JsonLinesSink(sockdir / "ledger.jsonl")


@pytest.fixture(scope="session")
def netns():
    """The runner for scenarios that name non-loopback addresses (see egress_netns)."""
    reason = netns_available()
    if reason:
        pytest.skip(reason)
    return run_in_netns
