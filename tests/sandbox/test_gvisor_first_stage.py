"""The gVisor driver refuses an image without the guest's first stage
(`/opt/aamp/agent-init`) before runsc is started, with an error that says to rebuild it,
instead of whatever runsc says about a missing executable."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from aamp.sandbox.driver import DriverError, SandboxSpec
from aamp.sandbox.gvisor import AGENT_IN_GUEST, FIRST_STAGE_IN_GUEST, GVisorDriver
from aamp.sandbox.images import BuiltImage


def _image(tmp_path: Path, *, first_stage: bool) -> BuiltImage:
    """An image tree as an older build left it: the agent there, the first stage not."""
    root = tmp_path / "images" / "old" / ("ab" * 16) / "rootfs"
    agent = root / AGENT_IN_GUEST.lstrip("/")
    agent.parent.mkdir(parents=True)
    agent.write_text("#!/bin/sh\n")
    agent.chmod(0o755)
    if first_stage:
        (root / FIRST_STAGE_IN_GUEST.lstrip("/")).write_text("not executable")
    return BuiltImage(
        name="old",
        content_hash="ab" * 16,
        root=root,
        ext4=root.parent / "rootfs.ext4",
        size_bytes=0,
        ext4_bytes=0,
        built_at=dt.datetime.now(dt.UTC),
        build_seconds=0.0,
    )


@pytest.mark.parametrize("first_stage", [False, True], ids=["missing", "not-executable"])
async def test_an_image_without_the_first_stage_is_refused_before_runsc(
    tmp_path: Path, first_stage: bool
) -> None:
    driver = GVisorDriver(tmp_path / "run")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    with pytest.raises(DriverError) as refused:
        await driver.create(
            "sb-0123456789ab",
            SandboxSpec(image="old"),
            _image(tmp_path, first_stage=first_stage),
            state_dir,
        )
    message = str(refused.value)
    assert f"has no executable {FIRST_STAGE_IN_GUEST}" in message
    assert "rebuild it: aamp image build old --force" in message
    assert not (state_dir / "bundle").exists()  # runsc was never asked
    assert not driver.runsc_root.exists()
