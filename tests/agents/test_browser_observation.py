"""The browser tool's host side, without a sandbox: the driver's answer is untrusted (a guest,
or a web page through it, may send anything), so what the model is told about policy comes
from the proxy's ledger only; screenshots reach the model only as real PNG/JPEG within the
agent's budget; timeouts are bounded by the tool timeout."""

from __future__ import annotations

import base64
import time

from aamp.agents.browser_settings import BrowserSettings
from aamp.agents.browser_tool import BrowserTool, observe
from aamp.agents.model_images import show_image
from aamp.agents.observation import ModelImage
from aamp.egress.ledger import EgressEvent

PNG = b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + (1280).to_bytes(4, "big") + (800).to_bytes(4, "big")
JPEG = b"\xff\xd8\xff\xe0" + b"j" * 100


def refusal(host: str, port: int, rule: str = "default: block") -> EgressEvent:
    return EgressEvent(
        "sb-1", time.time(), 1, "connect", host, port, None, "refused", rule,
        f"{host}:{port} matches no rule; default is block", 403, 0, 0, 0.0,
    )  # fmt: skip


def test_a_page_cannot_claim_a_policy_refusal_only_the_ledger_can() -> None:
    # The proxy's 403 page (or a site imitating it) is only a status to the host.
    answer = {"ok": True, "status": 403, "url": "http://shop.test/", "title": "aamp egress refused"}
    text = observe({"action": "open", "url": "http://shop.test/"}, answer, [], BrowserSettings())
    assert "http status: 403" in text.text and "egress policy" not in text.text
    assert not text.ok
    refused = [refusal("shop.test", 80)]
    args = {"action": "open", "url": "http://shop.test/"}
    seen = observe(args, answer, refused, BrowserSettings())
    assert seen.text.startswith(
        "error: refused by the egress policy: http://shop.test/ was not loaded "
        "(rule: default: block;"
    )
    assert seen.detail["refused"] == {"url": "http://shop.test/", "rule": "default: block"}


def test_an_https_refusal_is_named_from_the_ledger_and_other_refusals_are_listed() -> None:
    answer = {
        "ok": False,
        "error": "could not load https://x.test/: net::ERR_TUNNEL_CONNECTION_FAILED",
        "navigation_error": {
            "url": "https://x.test/", "error": "net::ERR_TUNNEL_CONNECTION_FAILED"
        },
        "failed_requests": [
            {"url": "https://cdn.test/a.js", "method": "GET", "resource": "script",
             "error": "net::ERR_TUNNEL_CONNECTION_FAILED"},
            {"url": "http://legacy.test/missing.png", "method": "GET", "resource": "image",
             "error": "net::ERR_EMPTY_RESPONSE"},
        ],
    }  # fmt: skip
    refused = [
        refusal("x.test", 443),
        refusal("cdn.test", 443),
        refusal("t.test", 80, "deny[0] t.test"),
    ]
    o = observe({"action": "open", "url": "https://x.test/"}, answer, refused, BrowserSettings())
    assert "refused by the egress policy: https://x.test/ was not loaded" in o.text
    assert "- cdn.test:443 (rule: default: block), e.g. https://cdn.test/a.js" in o.text
    assert "- t.test:80 (rule: deny[0] t.test)" in o.text
    failed = "failed requests:\n- GET http://legacy.test/missing.png (image): net::ERR_EMPTY"
    assert failed in o.text
    assert "x.test:443" not in o.text.split("blocked by the egress policy:")[1]


def test_screenshots_are_checked_and_sent_to_the_model_only_within_budget() -> None:
    image = {"png_b64": base64.b64encode(PNG).decode(), "size": [1280, 800]}
    args = {"action": "screenshot"}
    plain = observe(args, {"ok": True, "image": image}, [], BrowserSettings())
    assert plain.screenshot == PNG and plain.model_image is None
    assert "screenshot taken (1280x800 24 bytes PNG)" in plain.text
    assert "not sent images" in plain.text
    seeing = BrowserSettings(images=True, image_max_bytes=10_000)
    shown = observe(args, {"ok": True, "image": image}, [], seeing)
    assert shown.model_image == ModelImage("image/png", PNG)
    tight = BrowserSettings(images=True, image_max_bytes=20)
    with_jpeg = {**image, "model_jpeg_b64": base64.b64encode(JPEG[:20]).decode()}
    assert observe(args, {"ok": True, "image": with_jpeg}, [], tight).model_image == ModelImage(
        "image/jpeg", JPEG[:20]
    )
    too_big = observe(args, {"ok": True, "image": image}, [], tight)
    assert too_big.model_image is None and "over the image budget of 20 bytes" in too_big.text
    for bad in ("bm90IGEgcG5n", "%%%", 42, "A" * 10_000_000):
        o = observe(args, {"ok": True, "image": {"png_b64": bad}}, [], seeing)
        assert not o.ok and o.screenshot is None and o.model_image is None
        assert "not a usable PNG" in o.text


def test_garbage_fields_are_ignored_not_trusted() -> None:
    answer = {
        "ok": True,
        "url": ["not", "a", "string"],
        "status": "200",
        "events": "nope",
        "tabs": [1, None, {"id": 7}],
        "tables": [{"rows": "x"}, {"rows": [["a", 1, None]], "total": "9"}],
        "failed_requests": {"a": 1},
        "snapshot": 12,
        "dialog_open": "yes",
    }
    o = observe({"action": "read", "format": "rows"}, answer, [], BrowserSettings())
    assert o.ok and "http status" not in o.text and "snapshot:" not in o.text
    assert '["a", "", ""]' in o.text


def test_call_timeouts_default_by_action_and_are_bounded_by_the_tool_timeout() -> None:
    tool = BrowserTool(lambda: None, 20, BrowserSettings(dialogs="accept"))  # type: ignore[arg-type]
    assert tool.request({"action": "click", "ref": "e1"})["timeout"] == 5.0
    assert tool.request({"action": "open", "url": "http://a/"})["timeout"] == 20.0
    assert tool.request({"action": "wait_for", "text": "x", "timeout": 900})["timeout"] == 20.0
    request = tool.request({"action": "screenshot"})
    assert request["dialog_default"] == "accept" and "image_budget" not in request
    seeing = BrowserTool(lambda: None, 60, BrowserSettings(images=True, image_max_bytes=50_000))  # type: ignore[arg-type]
    assert seeing.request({"action": "screenshot"})["image_budget"] == 50_000


def test_only_the_latest_screenshot_stays_in_the_conversation() -> None:
    messages: list[dict] = [{"role": "user", "content": "task"}]
    show_image(messages, ModelImage("image/png", PNG), "call_1")
    show_image(messages, ModelImage("image/jpeg", JPEG), "call_2")
    first, second = messages[1], messages[2]
    assert isinstance(first["content"], str) and "earlier screenshot" in first["content"]
    url = second["content"][1]["image_url"]["url"]
    assert url == "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()
    assert "call_2" in second["content"][0]["text"] and messages[0]["content"] == "task"
