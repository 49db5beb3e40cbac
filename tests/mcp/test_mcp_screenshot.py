"""`browser_screenshot` with the official MCP client over `/mcp`, against a page served in a
private network namespace (screenshot_probe.py): the PNG comes back as MCP image content,
taken through the sandbox policy's egress proxy; a domain the policy blocks is refused as a
policy refusal naming the rule, never loaded; both are in the audit log with the URL (and
the screenshot's SHA-256), next to the proxy's own decisions."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
from netns_probe_run import run_probe  # tests/netns_probe_run.py

PROBE = Path(__file__).with_name("screenshot_probe.py")


@pytest.mark.slow
def test_a_screenshot_through_the_policys_egress_and_a_blocked_domain_refused(
    tmp_path, browser_image
) -> None:
    report = run_probe(
        PROBE,
        tmp_path / "home",
        [],
        timeout=600,
        AAMP_DRIVER="gvisor",
        AAMP_ADMIN_PASSWORD="admin-password-for-tests",
    )
    shot = report["shot"]
    assert not shot["is_error"], shot
    image, text = shot["content"]
    png = bytes.fromhex(image["png"])
    assert image["mime_type"] == "image/png" and png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 200 and height >= 100
    about = json.loads(text["text"])
    assert (about["status"], about["title"]) == (200, "Quarterly numbers")
    assert about["sha256"] == hashlib.sha256(png).hexdigest() and about["bytes"] == len(png)
    assert report["left_after_one_shot"]["sandboxes"] == []  # the one-shot sandbox is gone
    assert "/" in report["received"]

    blocked = report["blocked"]
    assert blocked["is_error"]
    said = blocked["content"][0]["text"]
    assert "refused (egress_refused): refused by the egress policy: http://blocked.test/" in said
    assert "rule:" in said

    audit = report["audit"]
    results = [r for r in audit if r["action"] == "sandbox.browser_result"]
    taken, refused = results
    assert taken["decision"] == "info" and taken["details"]["sha256"] == about["sha256"]
    assert taken["details"]["url"] == "http://app.test/" and taken["actor"] == "user:admin"
    assert refused["decision"] == "deny" and refused["details"]["url"] == "http://blocked.test/"
    assert refused["details"]["rule"]
    # The SDK's `Sandbox.screenshot`, the same API call: the page, and the same refusal.
    sdk = report["sdk_shot"]
    sdk_png = bytes.fromhex(sdk["png"])
    assert sdk_png.startswith(b"\x89PNG\r\n\x1a\n")
    assert sdk["sha256"] == hashlib.sha256(sdk_png).hexdigest()
    assert (sdk["status"], sdk["title"], sdk["url"]) == (
        200,
        "Quarterly numbers",
        "http://app.test/",
    )
    assert report["sdk_blocked"]["code"] == "egress_refused", report["sdk_blocked"]
    assert "http://blocked.test/" in report["sdk_blocked"]["message"]
    assert "rule:" in report["sdk_blocked"]["message"]
    egress = [r for r in audit if r["action"].startswith("egress.")]
    assert any("blocked.test" in r["resource"] and r["decision"] != "allow" for r in egress)
    assert any("app.test" in r["resource"] and r["decision"] == "allow" for r in egress)
    asked = [r for r in audit if r["action"] == "sandbox.browser" and r["decision"] == "allow"]
    assert len(asked) == 4  # each call: the guard's decision and the route's record of the URL
