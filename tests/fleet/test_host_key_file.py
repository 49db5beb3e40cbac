"""`aamp host serve` refuses a link key others could read or that belongs to another user (as
the installation's CAs refuse theirs), before it serves or registers anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aamp.fleet.host_process import CERT_FILES, HostConfig, HostStartError


def _config(tmp_path: Path) -> HostConfig:
    for name in CERT_FILES:
        (tmp_path / name).write_text("pem")
        (tmp_path / name).chmod(0o600)
    return HostConfig("h1", "http://127.0.0.1:1", "aamph_x", tmp_path, "127.0.0.1", 1, "x:1")


def test_a_private_key_file_is_accepted(tmp_path: Path) -> None:
    assert _config(tmp_path).cert_paths()[1] == tmp_path / "host.key"


def test_a_key_others_can_read_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "host.key").chmod(0o640)
    with pytest.raises(HostStartError, match="has mode 640; the link key must be 0600"):
        config.cert_paths()


def test_a_key_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    config = _config(tmp_path)
    os.chown(tmp_path / "host.key", 65534, 65534)
    with pytest.raises(HostStartError, match="belongs to uid 65534, not to the user"):
        config.cert_paths()
