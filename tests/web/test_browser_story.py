"""The whole story through the pages alone, in a real browser (Playwright driving Debian's
/usr/bin/chromium) against a real `aamp up`-like server on loopback with real gVisor sandboxes:

an admin creates a builder and two operators, a policy, a secret (whose value no response
to any of the browsers carries), a model endpoint (the scripted model test double) and grants
the agent its resources; the builder creates the agent in the form, publishes it and lets the
operator run it; the operator starts a run with a CSV and sees its steps arrive while the run
goes on (the scripted model's first answer is slow) and the screenshot the agent's browser
tool took, inline; the admin sees the run's sandbox among the live ones; the policy asks a
person before the artifact leaves, and the operator (the run's owner) answers it in the
live view — another operator with run on the agent sees neither the run nor a form, and
posting the answer by hand is refused, on record; the operator downloads the artifact,
byte-identical. Every request the browser made went to the installation itself.

With AAMP_UI_SCREENSHOTS=DIR the test saves the live run view and the builder as PNGs there
(the README's pictures: `AAMP_UI_SCREENSHOTS=docs/ui pytest tests/web/test_browser_story.py`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from api_plane import ADMIN_PASSWORD, booting_plane_settings, running_plane
from scripted_model import ScriptedModelServerForTests
from web_helpers import CHROMIUM, in_chromium, sign_in

from aamp.web import site_of

pytest.importorskip("playwright.async_api")
CSV = b"region,amount\nnorth,120\nsouth,80\neast,42\n"
REPORT = b"total\n242\n"
SECRET = "story-secret-value-0f9e8d7c"
COMPUTE = """
import csv
rows = list(csv.DictReader(open('/workspace/in/sales.csv')))
total = sum(int(r['amount']) for r in rows)
open('/workspace/out/report.csv', 'w').write(f'total\\n{total}\\n')
print('total', total)
"""
POLICY = """name: csv-reports
egress: {default: block}
image: browser
data:
  inbound: {max_bytes: 1MB, types: [csv]}
  outbound: {max_bytes: 1MB, types: [csv], approval: true}
lifetime: {ttl: 10m, idle: 5m}
"""


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
async def test_the_whole_story_in_a_real_browser(tmp_path: Path, browser_image) -> None:
    shots = os.environ.get("AAMP_UI_SCREENSHOTS")
    turns = [
        {"sleep": 4, "tool_calls": [{"name": "python", "arguments": {"code": COMPUTE}}]},
        {"tool_calls": [{"name": "browser", "arguments": {"action": "screenshot"}}]},
        {"content": "Wrote out/report.csv"},
    ]
    with ScriptedModelServerForTests(turns) as model:
        settings = booting_plane_settings(tmp_path)
        async with (
            running_plane(settings) as plane,
            in_chromium(site_of(plane.app)) as (base, browser),  # type: ignore[arg-type]
        ):
            requests: list[str] = []
            await _story(browser, base, model.base_url, requests, shots)
    outside = [u for u in requests if not u.startswith((base + "/", "data:"))]
    assert requests and outside == [], outside


async def _story(browser, base, model_url, requests, shots) -> None:  # type: ignore[no-untyped-def]
    responses: list = []

    def watch(context) -> None:  # type: ignore[no-untyped-def]
        context.on("request", lambda r: requests.append(r.url))
        # Each body is asked for as it arrives, before a navigation can drop it.
        context.on("response", lambda r: responses.append((r, asyncio.ensure_future(r.body()))))

    # The admin: users, a policy, the model endpoint.
    admin_ctx, admin = await sign_in(browser, base, "admin", ADMIN_PASSWORD)
    watch(admin_ctx)
    for user, role in (("bob", "builder"), ("olga", "operator"), ("omar", "operator")):
        await admin.goto("/admin/users")
        await admin.fill("#f-username", user)
        await admin.select_option("#f-role", role)
        await admin.fill("#f-password", f"{user}-password-1")
        await admin.click("#new-user button[type=submit]")
        await admin.wait_for_load_state()
    assert "olga" in await admin.inner_text("table")
    await admin.goto("/admin/policies/new")
    await admin.fill("#f-name", "csv-reports")
    await admin.fill("#f-source", POLICY)
    await admin.click("form button[type=submit]")
    await admin.wait_for_selector("text=The five boundaries")
    await admin.goto("/admin/catalog")
    await admin.fill("#endpoint-form #f-name", "llm")
    await admin.fill("#f-base_url", model_url)
    await admin.fill("#f-models", "scripted")
    await admin.click("#endpoint-form button[type=submit]")
    await admin.wait_for_load_state()
    assert model_url in await admin.inner_text("table")

    # A secret set in its form (write-only).
    await admin.goto("/admin/secrets")
    await admin.fill("#f-name", "crm_token")
    await admin.fill("#f-value", SECRET)
    await admin.click("form.card button[type=submit]")
    await admin.wait_for_selector("td:has-text('crm_token')")

    # The builder: the agent in the form, published, shared with the operator.
    builder_ctx, builder = await sign_in(browser, base, "bob", "bob-password-1")
    watch(builder_ctx)
    await builder.goto("/build")
    await builder.fill("#f-name", "reporter")
    await builder.click("form.card button[type=submit]")
    await builder.wait_for_selector("#draft-form")
    agent_path = builder.url.removeprefix(base)
    await builder.select_option("#f-endpoint", "llm")
    await builder.select_option("#f-model", "scripted")
    await builder.fill("#f-system_prompt", "You total the sales in the CSV you are given.")
    for tool in ("shell", "python", "files", "browser"):
        await builder.check(f"input[name=tools][value={tool}]")
    await builder.select_option("#f-policy", "csv-reports")
    await builder.fill("#f-max_steps", "5")
    await builder.fill("#f-wall_time", "3m")
    await builder.click("#draft-form button[type=submit]")
    await builder.wait_for_selector("text=Draft saved.")
    await builder.click("text=Publish the draft")
    await builder.wait_for_selector("text=Published version 1.")
    await builder.fill("#f-who", "olga")
    await builder.select_option("#f-level", "run")
    await builder.click("#grants ~ form button[type=submit]")
    await builder.wait_for_selector("td:has-text('user olga')")
    await builder.fill("#f-who", "omar")
    await builder.select_option("#f-level", "run")
    await builder.click("#grants ~ form button[type=submit]")
    await builder.wait_for_selector("td:has-text('user omar')")
    if shots:
        await builder.set_viewport_size({"width": 1100, "height": 1400})
        await builder.screenshot(path=str(Path(shots) / "builder.png"), full_page=True)

    # The admin grants the agent what it uses.
    await admin.goto(agent_path)
    for kind, name in (("policy", "csv-reports"), ("image", "browser"), ("model-endpoint", "llm")):
        await admin.select_option("#f-kind", kind)
        await admin.fill("#f-rname", name)
        await admin.click("text=Grant to this agent")
        await admin.wait_for_selector(f"li:has-text('{kind}: {name}')")

    # The operator: a run with a CSV, steps arriving live.
    operator_ctx, operator = await sign_in(browser, base, "olga", "olga-password-1")
    watch(operator_ctx)
    await operator.goto("/agents")
    await operator.click("a.button:has-text('Run')")
    await operator.fill("#f-task", "Total the sales in sales.csv")
    await operator.set_input_files(
        "#f-inputs", files=[{"name": "sales.csv", "mimeType": "text/csv", "buffer": CSV}]
    )
    await operator.click("form button[type=submit]")
    await operator.wait_for_url("**/runs/run-*")
    run_path = operator.url.removeprefix(base)
    # While the model's slow first answer is pending, the input already shows as a step.
    await operator.wait_for_selector("li[data-type='file.in']", timeout=60_000)
    assert await operator.query_selector("li[data-type='model.call']") is None
    assert await operator.inner_text("#run-status") in ("queued", "running")
    await operator.wait_for_selector("li[data-type='tool.result']", timeout=60_000)
    assert "total 242" in await operator.inner_text("li[data-type='tool.result']")
    model_call = await operator.inner_text("li[data-type='model.call']")
    assert "prompt" in model_call and "completion tokens" in model_call
    assert "python" in await operator.inner_text("li[data-type='tool.call']")
    # The agent's browser tool took a screenshot: it is on the page, inline.
    shot = await operator.wait_for_selector("li[data-type='screenshot'] img", timeout=90_000)
    assert (await shot.get_attribute("src")).startswith("data:image/png;base64,iVBOR")
    assert await shot.evaluate("img => img.naturalWidth") > 0
    # The artifact waits for a person: the operator, whose run it is, may answer it.
    asked = await operator.wait_for_selector(
        "li[data-type='approval.requested'] button[value=approve]", timeout=60_000
    )
    approval_id = (
        await operator.get_attribute("li[data-type='approval.requested'] form", "action")
    ).rsplit("/", 1)[-1]

    # Meanwhile the admin sees the run's sandbox among the live ones, with its time left.
    created = await operator.inner_text("li[data-type='sandbox.created']")
    sandbox_id = created.split('"sandbox": "')[1].split('"')[0]
    await admin.goto("/sandboxes")
    row = await admin.inner_text(f"tr:has-text('{sandbox_id}')")
    assert "min" in row and "browser" in row

    # Another operator with run on the agent neither sees the run nor may answer its question:
    # the form posted by hand is refused by the API, and the refusal is on record.
    other_ctx, other = await sign_in(browser, base, "omar", "omar-password-1")
    watch(other_ctx)
    assert (await other.goto(run_path)).status == 403
    csrf = next(c["value"] for c in await other_ctx.cookies() if c["name"] == "aamp_csrf")
    refused = await other.request.post(
        f"/approvals/{approval_id}",
        form={"csrf": csrf, "decision": "approve", "next": "/runs"},
        headers={"origin": base},
    )
    assert refused.status == 403 and "answer approval:" in await refused.text()
    await other_ctx.close()
    await admin.goto("/admin/audit?actor=user:omar&action=approval.decide&decision=deny")
    assert f"approval:{approval_id}" in await admin.inner_text("main")

    await asked.click()
    await operator.wait_for_selector("li[data-type='approval.decided']", timeout=60_000)
    assert "by user:olga" in await operator.inner_text("li[data-type='approval.decided']")

    await operator.wait_for_selector("li[data-type='run.finished']", timeout=60_000)
    await operator.wait_for_selector("#run-status:has-text('succeeded')")
    if shots:
        await operator.set_viewport_size({"width": 1100, "height": 1600})
        await operator.screenshot(path=str(Path(shots) / "live-run.png"), full_page=True)
    async with operator.expect_download() as download_info:
        await operator.click("ul.artifacts a:has-text('report.csv')")
    download = await download_info.value
    saved = await download.path()
    assert Path(saved).read_bytes() == REPORT
    # A narrow window still shows the run (no horizontal scroll of the page itself).
    await operator.set_viewport_size({"width": 380, "height": 800})
    width = await operator.evaluate("document.documentElement.scrollWidth")
    assert width <= 400
    shutil.rmtree(Path(saved).parent, ignore_errors=True)
    # No response the browsers received carried the secret's value (the SSE streams and
    # redirects, which have no body to read afterwards, carry none either: they are built
    # from the run's events and the API's answers, which never hold it).
    checked = 0
    for response, body in responses:
        if response.status in (301, 302, 303) or "event-stream" in (
            response.headers.get("content-type", "")
        ):
            body.cancel()
            continue
        try:
            data = await body
        except Exception:
            continue
        checked += 1
        assert SECRET.encode() not in data, response.url
    assert checked > 20
