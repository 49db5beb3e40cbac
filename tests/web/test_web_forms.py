"""The UI's forms: what a person typed is kept after a refusal, each error is shown at its
field, and a refused form changes nothing; a new API token is shown once; one's own password
changes only with the current one."""

from __future__ import annotations

import base64
import re

from web_helpers import Site, csrf_of

POLICY = """name: xlsx-only
image: base
data:
  inbound: {max_bytes: 1KB, types: [xlsx]}
"""


async def _builder_with_agent(site: Site) -> tuple[object, str, str]:
    """A builder's browser, their agent's id, and a CSRF token; a policy and an endpoint."""
    admin = site.plane.client(site.plane.admin_token)
    async with admin:
        r = await admin.put(
            "/v1/policies/xlsx-only", content=POLICY, headers={"content-type": "application/yaml"}
        )
        assert r.status_code == 200, r.text
        r = await admin.put(
            "/v1/model-endpoints/llm",
            json={"base_url": "http://127.0.0.1:9/v1", "models": ["scripted"]},
        )
        assert r.status_code == 200, r.text
    await site.plane.user("bob", "builder", "bob-password-1")
    bob = await site.signed_in("bob", "bob-password-1")
    token = csrf_of((await bob.get("/build")).text)
    r = await bob.post("/build", data={"name": "reporter", "csrf": token})
    assert r.status_code == 303
    return bob, r.headers["location"].rsplit("/", 1)[1], token


def _draft_form(token: str, **over: str) -> dict[str, object]:
    return {
        "csrf": token,
        "endpoint": "llm",
        "model": "scripted",
        "system_prompt": "Be brief.",
        "tools": ["python", "files"],
        "policy": "xlsx-only",
        "max_steps": "5",
        "wall_time": "3m",
        **over,
    }


async def test_a_new_token_is_shown_once_and_can_be_revoked(site: Site) -> None:
    admin = await site.signed_in()
    token = csrf_of((await admin.get("/me")).text)
    r = await admin.post("/me/tokens", data={"name": "laptop", "csrf": token})
    assert r.status_code == 200
    secret = re.search(r'<code id="new-token">([^<]+)</code>', r.text).group(1)
    page = (await admin.get("/me")).text
    assert "laptop" in page and secret not in page
    row = re.search(r"<tr><td>laptop</td><td>([^<]+)</td>", page)
    token_id = row.group(1)
    api = site.plane.client(secret)
    async with api:
        assert (await api.get("/v1/me")).status_code == 200
        r = await admin.post(f"/me/tokens/{token_id}/revoke", data={"csrf": token})
        assert r.status_code == 303
        assert (await api.get("/v1/me")).status_code == 401
    r = await admin.post("/me/tokens", data={"name": "x", "expires_in_days": "soon", "csrf": token})
    assert r.status_code == 400 and 'value="soon"' in r.text and "field-error" in r.text


async def test_ones_own_password_is_changed_on_me_with_the_current_one(site: Site) -> None:
    await site.plane.user("olga", "operator", "olga-password-1")
    olga = await site.signed_in("olga", "olga-password-1")
    token = csrf_of((await olga.get("/me")).text)
    form = {"csrf": token, "current_password": "not-my-password", "password": "olga-new-pass-2"}
    r = await olga.post("/me/password", data=form)
    assert r.status_code == 403
    error = re.search(r'<p class="field-error" id="err-current_password"[^>]*>([^<]+)<', r.text)
    assert error and "not your current password" in error.group(1)
    form["current_password"] = "olga-password-1"
    r = await olga.post("/me/password", data=form)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert (await olga.get("/me")).status_code == 303  # every session ended: sign in again
    again = await site.signed_in("olga", "olga-new-pass-2")
    assert (await again.get("/me")).status_code == 200
    # An admin's own row on the users page points here instead of resetting without it.
    users = (await (await site.signed_in()).get("/admin/users")).text
    assert 'href="/me#own-password"' in users and 'id="pw-olga"' in users


async def test_a_bad_draft_is_shown_at_its_field_keeps_what_was_typed_and_saves_nothing(
    site: Site,
) -> None:
    bob, agent, token = await _builder_with_agent(site)
    form = _draft_form(token, max_steps="lots", system_prompt="Typed by hand.")
    r = await bob.post(f"/build/agents/{agent}/draft", data=form)
    assert r.status_code == 400
    error = re.search(r'<p class="field-error"[^>]*>([^<]*max_steps[^<]*)</p>', r.text)
    assert error, r.text
    assert 'id="f-max_steps" name="max_steps" type="text" value="lots"' in r.text
    assert "Typed by hand." in r.text
    api = site.plane.client(site.plane.admin_token)
    async with api:
        assert (await api.get(f"/v1/agents/{agent}/versions")).json() == []
    # The same form, corrected, saves; publishing freezes it; a change shows in the diff.
    r = await bob.post(f"/build/agents/{agent}/draft", data=_draft_form(token))
    assert r.status_code == 303
    r = await bob.post(f"/build/agents/{agent}/publish", data={"csrf": token})
    assert r.status_code == 303 and "published=1" in r.headers["location"]
    r = await bob.post(f"/build/agents/{agent}/draft", data=_draft_form(token, max_steps="7"))
    assert r.status_code == 303
    diff = (await bob.get(f"/build/agents/{agent}/diff?a=1&b=draft")).text
    assert "-  max_steps: 5" in diff and "+  max_steps: 7" in diff


async def test_the_yaml_editor_names_the_problem_and_keeps_the_text(site: Site) -> None:
    bob, agent, token = await _builder_with_agent(site)
    text = "model: {endpoint: llm, name: scripted}\npolicy: xlsx-only\npolicy: again\n"
    r = await bob.post(f"/build/agents/{agent}/yaml", data={"definition": text, "csrf": token})
    assert r.status_code == 400 and "policy: again" in r.text and "field-error" in r.text
    text = "model: {endpoint: llm, name: scripted}\npolicy: xlsx-only\ntools: [hammer]\n"
    r = await bob.post(f"/build/agents/{agent}/yaml", data={"definition": text, "csrf": token})
    assert r.status_code == 400 and "tools" in r.text and "[hammer]" in r.text
    text = "model: {endpoint: llm, name: scripted}\npolicy: xlsx-only\ntools: [python]\n"
    r = await bob.post(f"/build/agents/{agent}/yaml", data={"definition": text, "csrf": token})
    assert r.status_code == 303


async def test_an_input_the_policy_refuses_is_shown_at_the_field_and_starts_nothing(
    site: Site,
) -> None:
    bob, agent, token = await _builder_with_agent(site)
    assert (
        await bob.post(f"/build/agents/{agent}/draft", data=_draft_form(token))
    ).status_code == 303
    assert (
        await bob.post(f"/build/agents/{agent}/publish", data={"csrf": token})
    ).status_code == 303
    api = site.plane.client(site.plane.admin_token)
    async with api:
        for kind, name in (("policy", "xlsx-only"), ("image", "base"), ("model-endpoint", "llm")):
            r = await api.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": name})
            assert r.status_code == 201, r.text
    r = await bob.post(
        f"/agents/{agent}/run",
        data={"task": "Total it", "version": "latest", "csrf": token},
        files={"inputs": ("sales.csv", b"a,b\n1,2\n", "text/csv")},
    )
    assert r.status_code == 400
    error = re.search(r'<p class="field-error"[^>]*>([^<]*)</p>', r.text).group(1)
    assert "data.inbound.types" in error and "xlsx-only" in error and "csv" in error
    assert "Total it" in r.text  # the task typed is kept
    async with site.plane.client(site.plane.admin_token) as api:
        assert (await api.get("/v1/runs")).json() == []
    refusals = site.audit(action="run.file_in", decision="deny")
    assert refusals and refusals[-1]["actor"] == "user:bob"
    big = base64.b64encode(b"x" * 2000)  # over 1KB
    r = await bob.post(
        f"/agents/{agent}/run",
        data={"task": "Total it", "version": "latest", "csrf": token},
        files={"inputs": ("big.xlsx", big, "application/octet-stream")},
    )
    assert r.status_code == 413 and "data.inbound.max_bytes" in r.text


async def test_catalog_forms_keep_what_was_typed_and_register_when_right(site: Site) -> None:
    admin = await site.signed_in()
    token = csrf_of((await admin.get("/admin/catalog")).text)
    bad = {
        "name": "crm",
        "upstream": "https://crm.example",
        "auth": "magic",
        "secrets": "crm_token",
        "csrf": token,
    }
    r = await admin.post("/admin/services", data=bad)
    assert r.status_code == 422 and 'value="https://crm.example"' in r.text
    assert 'class="field-error"' in r.text
    async with site.plane.client(site.plane.admin_token) as api:
        assert (await api.get("/v1/services")).json() == []
    r = await admin.post("/admin/services", data={**bad, "auth": "bearer"})
    assert r.status_code == 303
    assert "https://crm.example" in (await admin.get("/admin/catalog")).text
    r = await admin.post(
        "/admin/model-endpoints",
        data={"name": "llm", "base_url": "llm.internal:8000", "models": "m", "csrf": token},
    )
    assert r.status_code == 400 and "llm.internal:8000" in r.text and "field-error" in r.text


async def test_delete_forms_refuse_what_is_in_use_at_its_row_on_record(site: Site) -> None:
    plane = site.plane
    async with plane.client(plane.admin_token) as api:
        assert (await api.put("/v1/secrets/crm_token", json={"value": "v"})).status_code == 200
        service = {"upstream": "https://crm.internal.example", "auth": "bearer"}
        r = await api.put("/v1/services/crm", json={**service, "secrets": ["crm_token"]})
        assert r.status_code == 200, r.text
        for body in ({"name": "uses-crm", "services": ["crm"]}, {"name": "lone"}):
            r = await api.put(f"/v1/policies/{body['name']}", json={"image": "base", **body})
            assert r.status_code == 200, r.text
        r = await api.put(
            "/v1/model-endpoints/llm",
            json={"base_url": "http://127.0.0.1:9/v1", "models": ["scripted"]},
        )
        assert r.status_code == 200, r.text
        agent = (await api.post("/v1/agents", json={"name": "user-of-it"})).json()["id"]
        for kind, name in (("policy", "uses-crm"), ("model-endpoint", "llm")):
            r = await api.post(f"/v1/agents/{agent}/resources", json={"kind": kind, "name": name})
            assert r.status_code == 201, r.text

    admin = await site.signed_in()
    token = csrf_of((await admin.get("/admin/policies")).text)
    # Without the CSRF token: refused, nothing deleted.
    r = await admin.post("/admin/policies/lone/delete", data={})
    assert r.status_code == 403
    assert "lone" in (await admin.get("/admin/policies")).text
    # In use: refused, the reason at the entry's own row, the entry kept, the refusal on record.
    in_use = {
        "/admin/policies/uses-crm/delete": (
            "err-delete-policies-uses-crm",
            f"policy uses-crm is in use by agent:{agent}; take it back from those agents",
        ),
        "/admin/services/crm/delete": (
            "err-delete-services-crm",
            "service crm is in use by policy:uses-crm; remove it from those policies first",
        ),
        "/admin/model-endpoints/llm/delete": (
            "err-delete-model-endpoints-llm",
            f"model-endpoint llm is in use by agent:{agent}",
        ),
    }
    for path, (error_id, reason) in in_use.items():
        r = await admin.post(path, data={"csrf": token})
        assert r.status_code == 409, (path, r.status_code)
        shown = re.search(
            rf'<p class="field-error" id="{error_id}" role="alert">([^<]+)</p>', r.text
        )
        assert shown and reason in shown.group(1).replace("&#39;", "'"), r.text
    async with plane.client(plane.admin_token) as api:
        assert (await api.get("/v1/policies/uses-crm")).status_code == 200
        assert (await api.get("/v1/services/crm")).status_code == 200
        assert (await api.get("/v1/model-endpoints/llm")).status_code == 200
        assert (await api.get(f"/v1/agents/{agent}/resources")).json()  # grants kept
    for action in ("policy.delete", "service.delete", "model_endpoint.delete"):
        denials = [r for r in site.audit(action=action) if r["decision"] == "deny"]
        [refusal] = [r for r in denials if "is in use by" in r["reason"]]
        assert refusal["actor"] == "user:admin"
    assert any("x-csrf-token" in r["reason"] for r in site.audit(action="policy.delete"))
    # Not in use: deleted, on record.
    r = await admin.post("/admin/policies/lone/delete", data={"csrf": token})
    assert r.status_code == 303 and r.headers["location"] == "/admin/policies"
    assert "lone" not in (await admin.get("/admin/policies")).text
    assert [r["decision"] for r in site.audit(action="policy.deleted")] == ["allow"]
