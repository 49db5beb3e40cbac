"""From inside a sandbox nothing is reachable: not the host's loopback services, not its other
addresses, not metadata, public DNS or a private network, and no name resolves.

The host side runs in a network namespace this test creates (`unshare -n`), where the
"outside" addresses are fake hosts on the namespace's own loopback: even if the boundary
under test were broken, no packet could leave the machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("base_image")


def test_guest_reaches_nothing(settings):
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    env = {
        "AAMP_HOME": str(settings.home),
        "AAMP_RUNTIME_DIR": str(settings.runtime_dir),
        "AAMP_IMAGE_DIR": str(settings.image_dir),
    }
    probe = Path(__file__).with_name("netns_probe.py")
    done = subprocess.run(
        ["unshare", "-n", sys.executable, str(probe), json.dumps(env)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])

    # The fake hosts are really there for the host side...
    assert set(report["control"].values()) == {"FAKEHOST"}
    guest = report["guest"]
    # ...and the guest reaches none of them.
    assert guest["interfaces"] == ["lo"]
    assert all(v.startswith("refused") for v in guest["tcp"].values()), guest["tcp"]
    assert guest["udp_dns"].startswith("refused"), guest["udp_dns"]
    assert all(v.startswith("refused") for v in guest["dns"].values()), guest["dns"]
