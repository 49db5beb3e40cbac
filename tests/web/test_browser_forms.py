"""Forms whose checks run in the browser, in a real one (Playwright driving Debian's
/usr/bin/chromium) against the whole site on loopback, with a control plane that boots
nothing: one plane, server and browser for the whole module (each test signs in afresh).

- The start-run form checks the chosen files' types and total size against the policy of
  the chosen version before anything is uploaded, naming the rule; the form is not sent.
  What it checks against comes from `GET /v1/agents/ID/inbound`, which `allowed()` gives
  exactly to those who may start that run, and which shows nothing else of the policy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from api_plane import Plane, plane_settings, running_plane
from run_helpers import make_agent
from web_helpers import CHROMIUM, in_chromium, sign_in

from aamp.web import site_of

pytest.importorskip("playwright.async_api")
pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
    pytest.mark.asyncio(loop_scope="module"),
]
CSV_POLICY = {
    "name": "csv-in",
    "image": "base",
    "data": {"inbound": {"max_bytes": "1KB", "types": ["csv"]}},
}
XLSX_POLICY = {
    "name": "xlsx-in",
    "image": "base",
    "data": {"inbound": {"max_bytes": "1MB", "types": ["xlsx"]}},
}


@dataclass
class Served:
    plane: Plane
    base: str
    browser: Any


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served_site(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    settings = plane_settings(tmp_path_factory.mktemp("plane"))
    async with (
        running_plane(settings) as plane,
        in_chromium(site_of(plane.app)) as (base, browser),  # type: ignore[arg-type]
    ):
        yield Served(plane, base, browser)


async def test_the_start_run_form_checks_files_against_the_policy_before_upload(
    served_site: Served,
) -> None:
    plane = served_site.plane
    async with plane.client(plane.admin_token) as admin:
        # Version 1 takes CSV up to 1 KB; version 2 (latest) takes only XLSX.
        agent = await make_agent(admin, "checker", "http://127.0.0.1:9/v1", CSV_POLICY)
        assert (await admin.put("/v1/policies/xlsx-in", json=XLSX_POLICY)).status_code == 200
        r = await admin.post(
            f"/v1/agents/{agent}/resources", json={"kind": "policy", "name": "xlsx-in"}
        )
        assert r.status_code == 201, r.text
        draft = (await admin.get(f"/v1/agents/{agent}/versions/1")).json()["definition"]
        r = await admin.put(f"/v1/agents/{agent}/draft", json={**draft, "policy": "xlsx-in"})
        assert r.status_code == 200, r.text
        assert (await admin.post(f"/v1/agents/{agent}/publish")).status_code == 200
    olga = await plane.user("olga", "operator", "olga-password-1")
    omar = await plane.user("omar", "operator", "omar-password-1")
    await plane.cp.store.run(
        lambda: plane.cp.directory.grant_user(agent, "olga", level="run", by="t")
    )

    # What the check reads: the inbound rule of the version asked for, and nothing else.
    async with plane.client(olga) as c:
        r = await c.get(f"/v1/agents/{agent}/inbound")
        assert r.json() == {"policy": "xlsx-in", "max_bytes": 1_000_000, "types": ["xlsx"]}
        r = await c.get(f"/v1/agents/{agent}/inbound", params={"version": "1"})
        assert r.json() == {"policy": "csv-in", "max_bytes": 1000, "types": ["csv"]}
        assert (
            await c.get(f"/v1/agents/{agent}/inbound", params={"version": "draft"})
        ).status_code == 403

    context, page = await sign_in(served_site.browser, served_site.base, "olga", "olga-password-1")
    posted: list[str] = []
    context.on("request", lambda r: posted.append(r.url) if r.method == "POST" else None)
    await page.goto(f"/agents/{agent}/run")
    await page.fill("#f-task", "Total the sales")
    check = page.locator("#inputs-check")
    # The latest version takes XLSX only: a CSV is refused, naming the rule.
    await page.set_input_files(
        "#f-inputs", files=[{"name": "sales.csv", "mimeType": "text/csv", "buffer": b"a,b\n"}]
    )
    await check.wait_for(state="visible")
    assert await check.inner_text() == (
        "sales.csv: data.inbound.types of policy 'xlsx-in' does not allow 'csv' (allowed: xlsx)"
    )
    await page.click("form.card button[type=submit]")
    await page.wait_for_timeout(300)
    assert posted == [] and page.url.endswith(f"/agents/{agent}/run")
    # Version 1 takes CSV: the same file passes, once that version's rule is read.
    await page.select_option("#f-version", "1")
    await check.wait_for(state="hidden")
    # ...but not more than 1 KB of it.
    await page.set_input_files(
        "#f-inputs",
        files=[{"name": "big.csv", "mimeType": "text/csv", "buffer": b"x" * 1500}],
    )
    await check.wait_for(state="visible")
    assert "data.inbound.max_bytes of policy 'csv-in' is 1000 bytes" in await check.inner_text()
    await page.click("form.card button[type=submit]")
    await page.wait_for_timeout(300)
    assert posted == []
    await context.close()
    # Nothing was sent, so nothing was refused or started on the server.
    async with plane.client(plane.admin_token) as admin:
        runs = (await admin.get("/v1/runs")).json()
    assert runs == []

    # An operator the agent is not shared with reads no rule of it: refused, on record.
    async with plane.client(omar) as c:
        r = await c.get(f"/v1/agents/{agent}/inbound")
    assert r.status_code == 403
    assert plane.decision(r.headers["x-request-id"]) == "deny"
