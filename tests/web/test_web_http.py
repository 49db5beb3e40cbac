"""The UI over HTTP, as a browser uses it: headers on every page, CSRF and Origin refusals,
each role's menu, the 403 page that is also a denial in the audit log, the UI's actions
leaving the same audit records as the API's, and a secret's value never in a page."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from sqlalchemy import text
from web_helpers import Site, csrf_of

from aamp.web import CSP

STATIC = Path(__file__).resolve().parents[2] / "src" / "aamp" / "web" / "static"
ADMIN_PAGES = [
    "/admin/users",
    "/admin/policies",
    "/admin/policies/new",
    "/admin/catalog",
    "/admin/images",
    "/admin/secrets",
    "/admin/audit",
]
EVERY_PAGE = [
    "/login",
    "/me",
    "/agents",
    "/runs",
    "/build",
    "/approvals",
    "/sandboxes",
    *ADMIN_PAGES,
    "/nope",
]


def test_vendored_files_match_their_recorded_hashes() -> None:
    table = (STATIC / "VENDORED.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", table, re.M)
    assert {name for name, _ in rows} == {p.name for p in STATIC.glob("*.min.js")}
    for name, sha in rows:
        assert hashlib.sha256((STATIC / name).read_bytes()).hexdigest() == sha, name


async def test_every_page_and_api_answer_carries_the_security_headers(site: Site) -> None:
    admin = await site.signed_in()
    for path in [*EVERY_PAGE, "/static/aamp.css", "/v1/me", "/v1/nope"]:
        r = await admin.get(path)
        assert r.headers["content-security-policy"] == CSP, path
        assert r.headers["x-frame-options"] == "DENY", path
    assert "'unsafe-inline'" not in CSP and "'unsafe-eval'" not in CSP
    assert "default-src 'self'" in CSP and "frame-ancestors 'none'" in CSP
    page = (await admin.get("/me")).text
    # No inline script or style, and nothing from another origin.
    assert re.findall(r"<script(?![^>]*\bsrc=\"/static/)", page) == []
    assert "style=" not in page and "<style" not in page
    assert re.findall(r'(?:src|href)="(?!/|#|\?)', page) == []


async def test_every_form_carries_the_sessions_csrf_token(site: Site) -> None:
    admin = await site.signed_in()
    token = admin.cookies["aamp_csrf"]
    assert token
    # The sign-in form has no session to tie a token to; the Origin check guards it (below).
    for path in [p for p in EVERY_PAGE if p != "/login"]:
        page = (await admin.get(path)).text
        for form in re.findall(r'<form method="post".*?</form>', page, re.S):
            assert f'name="csrf" value="{token}"' in form, (path, form[:200])


async def test_a_form_without_the_csrf_token_is_refused_and_changes_nothing(site: Site) -> None:
    admin = await site.signed_in()
    form = {"username": "mallory", "role": "admin", "password": "mallory-password-1"}
    r = await admin.post("/admin/users", data=form)
    assert r.status_code == 403
    assert "CSRF" in r.text or "csrf" in r.text
    assert "mallory" not in (await admin.get("/admin/users")).text
    denied = site.audit(action="user.create", decision="deny")
    assert denied and denied[-1]["actor"] == "user:admin"
    token = csrf_of((await admin.get("/admin/users")).text)
    r = await admin.post("/admin/users", data={**form, "csrf": token + "x"})
    assert r.status_code == 403 and "mallory" not in (await admin.get("/admin/users")).text


async def test_a_form_posted_from_another_origin_is_refused(site: Site) -> None:
    admin = await site.signed_in()
    token = csrf_of((await admin.get("/admin/users")).text)
    form = {"username": "eve", "role": "admin", "password": "eve-password-123", "csrf": token}
    for headers in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"}):
        r = await admin.post("/admin/users", data=form, headers=headers)
        assert r.status_code == 403, headers
        assert "cross-origin request refused" in r.text
    assert "eve" not in (await admin.get("/admin/users")).text
    refused = [r for r in site.audit(action="user.create", decision="deny")]
    assert len(refused) == 2 and all("cross-origin" in r["reason"] for r in refused)
    # Signing in from another site's page is refused too.
    stranger = site.browser(origin="http://evil.example")
    r = await stranger.post("/login", data={"username": "admin", "password": "x"})
    assert r.status_code == 403 and "aamp_session" not in r.headers.get("set-cookie", "")
    # The same form from this site works (the token and origin were all that was wrong).
    r = await admin.post("/admin/users", data=form)
    assert r.status_code == 303 and "eve" in (await admin.get("/admin/users")).text


async def test_each_role_sees_its_own_menu(site: Site) -> None:
    await site.plane.user("bob", "builder", "bob-password-1")
    await site.plane.user("olga", "operator", "olga-password-1")
    menus = {}
    for user, password in (("admin", None), ("bob", "bob-password-1"), ("olga", "olga-password-1")):
        b = await (site.signed_in(user, password) if password else site.signed_in())
        nav = re.search(r'<nav aria-label="main">(.*?)</nav>', (await b.get("/me")).text, re.S)
        assert nav
        menus[user] = re.findall(r'href="([^"]+)"', nav.group(1))
    assert menus["olga"] == ["/agents", "/runs", "/sandboxes"]
    assert menus["bob"] == [
        "/agents",
        "/runs",
        "/build",
        "/knowledge-bases",
        "/approvals",
        "/sandboxes",
    ]
    assert set(ADMIN_PAGES) - {"/admin/policies/new"} <= set(menus["admin"])


async def test_an_operator_typing_an_admin_address_gets_403_and_a_denial_on_record(
    site: Site,
) -> None:
    await site.plane.user("olga", "operator", "olga-password-1")
    olga = await site.signed_in("olga", "olga-password-1")
    for path in ADMIN_PAGES:
        r = await olga.get(path)
        assert r.status_code == 403, path
        assert "Not allowed" in r.text and "What to do" in r.text, path
        assert "/admin/" not in re.search(r"<nav.*?</nav>", r.text, re.S).group(0)
    denied = site.audit(actor="user:olga", decision="deny")
    assert {r["action"] for r in denied} >= {"user.list", "audit.read", "secret.list"}
    assert all(r["reason"] for r in denied)


async def test_not_signed_in_goes_to_the_login_page_and_back(site: Site) -> None:
    b = site.browser()
    r = await b.get("/admin/audit?actor=x")
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/admin/audit%3Factor%3Dx"
    r = await b.post(
        "/login", data={"username": "admin", "password": "wrong", "next": "/admin/audit"}
    )
    assert r.status_code == 401 and 'value="admin"' in r.text  # the typed name is kept
    assert site.audit(action="login", decision="deny")
    r = await b.post(
        "/login",
        data={
            "username": "admin",
            "password": "admin-password-for-tests",
            "next": "//evil.example/",
        },
    )
    assert r.status_code == 303 and r.headers["location"] == "/"  # never to another site


async def test_ui_actions_leave_the_api_twins_audit_records(site: Site) -> None:
    admin = await site.signed_in()
    token = csrf_of((await admin.get("/admin/users")).text)
    form = {"username": "bob", "role": "builder", "password": "bob-password-1", "csrf": token}
    assert (await admin.post("/admin/users", data=form)).status_code == 303
    ui = [
        (r["action"], r["decision"], r["resource"])
        for r in site.audit()
        if r["action"].startswith("user.c")
    ]
    api = site.plane.client(site.plane.admin_token)
    async with api:
        r = await api.post(
            "/v1/users", json={"username": "carl", "role": "builder", "password": "carl-password-1"}
        )
        assert r.status_code == 201
    twin = [
        (r["action"], r["decision"], r["resource"])
        for r in site.audit()
        if r["action"].startswith("user.c")
    ][len(ui) :]
    assert [a for a, _, _ in ui] == [a for a, _, _ in twin] == ["user.create", "user.created"]
    assert ui[1][2] == "user:bob" and twin[1][2] == "user:carl"


async def test_a_secret_value_never_appears_in_any_page(site: Site) -> None:
    admin = await site.signed_in()
    value = "s3cr3t-VALUE-that-must-never-show"
    token = csrf_of((await admin.get("/admin/secrets")).text)
    r = await admin.post(
        "/admin/secrets", data={"name": "crm_token", "value": value, "csrf": token}
    )
    assert r.status_code == 303
    # A failed set does not show the typed value again either.
    r = await admin.post(
        "/admin/secrets", data={"name": "bad name!", "value": value, "csrf": token}
    )
    assert r.status_code == 400 and value not in r.text and "bad name!" in r.text
    for path in EVERY_PAGE:
        r = await admin.get(path)
        assert value not in r.text, path
    r = await admin.get("/admin/audit/export")
    assert r.status_code == 200 and value not in r.text and "secret" in r.text
    assert "crm_token" in (await admin.get("/admin/secrets")).text


async def test_bad_input_is_shown_at_the_field_with_what_was_typed(site: Site) -> None:
    admin = await site.signed_in()
    token = csrf_of((await admin.get("/admin/users")).text)
    r = await admin.post(
        "/admin/users",
        data={"username": "bad name", "role": "builder", "password": "pw-123456789", "csrf": token},
    )
    assert r.status_code in (400, 422)
    assert 'class="field-error"' in r.text and 'value="bad name"' in r.text
    assert "bad name" not in [
        u["username"]
        for u in (await site.plane.client(site.plane.admin_token).get("/v1/users")).json()
    ]
    r = await admin.post(
        "/admin/policies/new",
        data={"name": "p1", "csrf": token, "source": "name: p1\negress: {default: maybe}\n"},
    )
    assert r.status_code == 400 and "egress.default" in r.text and "default: maybe" in r.text


async def test_the_audit_page_verifies_the_chain_on_request_and_names_a_tampered_record(
    site: Site,
) -> None:
    admin = await site.signed_in()
    r = await admin.get("/admin/audit?verify=1")
    result = re.search(r'<p class="(\w+)" role="status" id="verify-result">([^<]*)</p>', r.text)
    assert result and result.group(1) == "notice", r.text
    with site.plane.cp.store.engine.begin() as conn:
        conn.execute(text("UPDATE audit_records SET reason = 'edited' WHERE seq = 2"))
    r = await admin.get("/admin/audit?verify=1")
    result = re.search(r'<p class="(\w+)" role="status" id="verify-result">([^<]*)</p>', r.text)
    assert result and result.group(1) == "error" and "2" in result.group(2), r.text
    assert "Chain check" not in (await admin.get("/admin/audit")).text  # only when asked


async def test_a_page_request_over_the_size_limit_is_refused_before_it_is_read(
    site: Site,
) -> None:
    stranger = site.browser()
    r = await stranger.post(
        "/login",
        content=b"x" * (2 * 1024 * 1024),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 413
    admin = await site.signed_in()
    r = await admin.post(
        "/agents/ag-1/run", files={"inputs": ("big.csv", b"x" * 19_000_000)}, data={"task": "t"}
    )
    assert r.status_code == 413
