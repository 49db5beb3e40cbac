"""Secrets never enter the guest: a service called from inside a real sandbox gets its
credential injected host-side, and nothing the guest can see holds the secret's value.

Runs the host side in a network namespace this test creates (see service_probe.py).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "egress"))
from secret_leaks import leaked

pytestmark = pytest.mark.usefixtures("base_image")
PROBE = Path(__file__).with_name("service_probe.py")


def test_secret_is_injected_on_the_host_and_never_seen_in_the_guest(settings, shared_ca_dir):
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    env = {
        "AAMP_HOME": str(settings.home),
        "AAMP_RUNTIME_DIR": str(settings.runtime_dir),
        "AAMP_IMAGE_DIR": str(settings.image_dir),
    }
    done = subprocess.run(
        ["unshare", "-n", sys.executable, str(PROBE), json.dumps(env), str(shared_ca_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    value = report.pop("secret_value")
    forms = [value, base64.b64encode(value.encode()).decode()]

    # The service got the real credential, both times (a guest-set header was replaced).
    seen = report["upstream_saw"]
    service_calls = [s for s in seen if s["host-served"] == "a.test" and s["path"] == "/whoami"]
    assert [s["authorization"] for s in service_calls] == [f"Bearer {value}"] * 2
    # The exfiltration attempt went out with the placeholder, never the value.
    exfil = [s for s in seen if s["host-served"] == "b.test"]
    assert [s["x-leak"] for s in exfil] == ["{{secret:crm_token}}"]
    assert "authorization" not in exfil[0]

    # The guest's view: the calls worked, and the value is nowhere in it.
    assert "curl exit 0" in report["guest_output"], report["guest_output"]
    assert json.loads(report["service.txt"])["you_sent"].startswith("Bearer ")
    upstream_side = report.pop("upstream_saw")  # the host side, not the guest's
    assert upstream_side
    everything_the_guest_saw = json.dumps(report)
    for form in forms:
        assert form not in everything_the_guest_saw
    # An upstream that writes the credential back in every form it could (br- and
    # gzip-encoded): the guest got the answer, and no reading of anything it saw holds
    # a piece of the value.
    reflected = [s for s in upstream_side if s["path"].startswith("/reflect/")]
    assert [s["authorization"] for s in reflected] == [f"Bearer {value}"] * 2
    for name in ("reflect-br.txt", "reflect-gzip.txt"):
        assert "\npart0-b64-1=[" in report[name] and "\npart0-swapcase=[" in report[name]
    assert "x-reflect-0:" in report["reflect-br.head"].lower()
    assert leaked(everything_the_guest_saw.encode(), [value]) is None
