"""Identity through the API: sessions with CSRF, tokens, throttling, no self-escalation,
operators' isolation, and that builders never read secret values or the audit log."""

from __future__ import annotations

import hashlib

from sqlalchemy import text

from aamp.api.context import SandboxOwner
from aamp.identity.credentials import digest


async def test_cookie_session_needs_csrf_on_unsafe_methods(plane) -> None:
    await plane.user("bea", "builder", "bea-password-1")
    async with plane.client() as c:
        resp = await c.post("/v1/session", json={"username": "bea", "password": "bea-password-1"})
        assert resp.status_code == 200
        cookie = resp.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        csrf = resp.json()["csrf_token"]
        assert (await c.get("/v1/me")).json()["username"] == "bea"
        refused = await c.post("/v1/agents", json={"name": "x1"})
        assert refused.status_code == 403 and refused.json()["code"] == "csrf_failed"
        wrong = await c.post("/v1/agents", json={"name": "x1"}, headers={"x-csrf-token": "no"})
        assert wrong.status_code == 403
        ok = await c.post("/v1/agents", json={"name": "x1"}, headers={"x-csrf-token": csrf})
        assert ok.status_code == 201
        assert (await c.delete("/v1/session", headers={"x-csrf-token": csrf})).status_code == 204
        assert (await c.get("/v1/me")).status_code == 401
    # Only hashes of the session id and CSRF token are stored.
    with plane.cp.store.engine.connect() as conn:
        rows = conn.execute(text("SELECT csrf_hash FROM sessions")).scalars().all()
    assert digest(csrf) in rows or rows == []
    assert csrf not in rows


async def test_failed_logins_are_audited_and_throttled(plane) -> None:
    await plane.user("olly", "operator", "olly-password-1")
    async with plane.client() as c:
        for _ in range(5):
            bad = await c.post("/v1/session", json={"username": "olly", "password": "nope-nope"})
            assert bad.status_code == 401
        locked = await c.post(
            "/v1/session", json={"username": "olly", "password": "olly-password-1"}
        )
        assert locked.status_code == 429 and "too many failed logins" in locked.json()["message"]
    with plane.cp.store.engine.connect() as conn:
        denied = conn.execute(
            text(
                "SELECT count(*) FROM audit_records WHERE action = 'login' "
                "AND decision = 'deny' AND resource = 'user:olly'"
            )
        ).scalar()
    assert denied == 6


async def test_tokens_expire_revoke_and_are_stored_hashed(plane) -> None:
    token = await plane.user("bob", "builder")
    async with plane.client(token) as c:
        made = (await c.post("/v1/tokens", json={"name": "ci", "expires_in_days": 1})).json()
        assert made["token"].startswith("aamp_") and made["expires_at"]
        async with plane.client(made["token"]) as c2:
            assert (await c2.get("/v1/me")).status_code == 200
            assert (await c.delete(f"/v1/tokens/{made['id']}")).status_code == 200
            gone = await c2.get("/v1/me")
            assert gone.status_code == 401 and "revoked" in gone.json()["message"]
        listed = (await c.get("/v1/tokens")).json()
        assert all("token" not in t for t in listed)
        assert any(t["last_used_at"] for t in listed)
    with plane.cp.store.engine.connect() as conn:
        hashes = conn.execute(text("SELECT token_hash FROM api_tokens")).scalars().all()
    assert hashlib.sha256(made["token"].encode()).hexdigest() in hashes
    assert made["token"] not in hashes
    # An expired token is refused.
    with plane.cp.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE api_tokens SET expires_at = '2000-01-01T00:00:00.000000Z' WHERE id = :i"),
            {"i": made["id"]},
        )
        conn.execute(text("UPDATE api_tokens SET revoked_at = NULL"))
    async with plane.client(made["token"]) as c2:
        assert "expired" in (await c2.get("/v1/me")).json()["message"]


async def test_disabled_user_is_locked_out(plane) -> None:
    token = await plane.user("dan", "operator")
    async with plane.client(plane.admin_token) as admin:
        assert (await admin.patch("/v1/users/dan", json={"disabled": True})).status_code == 200
    async with plane.client(token) as c:
        assert (await c.get("/v1/me")).status_code == 401


async def test_nobody_escalates_themselves(plane) -> None:
    cp = plane.cp
    token = await plane.user("ed", "builder")
    agent = await cp.store.run(lambda: cp.agents.create("shared", owner="admin"))
    await cp.store.run(lambda: cp.directory.grant_user(agent.id, "ed", level="view", by="t"))
    async with plane.client(token) as c:
        assert (await c.patch("/v1/users/ed", json={"role": "admin"})).status_code == 403
        for body in (
            {"user": "ed", "level": "edit"},
            {"role": "builder", "level": "edit"},
        ):
            resp = await c.post(f"/v1/agents/{agent.id}/grants", json=body)
            assert resp.status_code == 403, resp.text
        # A token someone makes carries their own role, never more.
        made = (await c.post("/v1/tokens", json={"name": "x"})).json()
    async with plane.client(made["token"]) as c2:
        assert (await c2.get("/v1/me")).json()["role"] == "builder"
        assert (await c2.get("/v1/users")).status_code == 403
    async with plane.client(plane.admin_token) as admin:
        own = await admin.patch("/v1/users/admin", json={"role": "operator"})
        assert own.status_code == 403
        assert (
            await admin.post(
                f"/v1/agents/{agent.id}/grants", json={"user": "admin", "level": "edit"}
            )
        ).status_code == 403
    assert (await cp.store.run(cp.directory.get_user, "ed")).role.value == "builder"
    grants = await cp.store.run(cp.directory.list_grants, agent.id)
    assert [(g.user, g.level.value) for g in grants] == [("ed", "view")]


async def test_a_grant_names_exactly_one_of_user_or_role(plane) -> None:
    cp = plane.cp
    await plane.user("gus", "operator")
    agent = await cp.store.run(lambda: cp.agents.create("granted", owner="admin"))
    url = f"/v1/agents/{agent.id}/grants"
    async with plane.client(plane.admin_token) as admin:
        for body in (
            {"level": "view"},
            {"user": "gus", "role": "operator", "level": "view"},
        ):
            resp = await admin.post(url, json=body)
            assert resp.status_code == 400, resp.text
            assert "exactly one of user or role" in resp.json()["message"]
        assert (await cp.store.run(cp.directory.list_grants, agent.id)) == []
        by_user = await admin.post(url, json={"user": "gus", "level": "view"})
        by_role = await admin.post(url, json={"role": "operator", "level": "run"})
        again = await admin.post(url, json={"user": "gus", "level": "edit"})
    assert [r.status_code for r in (by_user, by_role, again)] == [201, 201, 201]
    assert (by_user.json()["user"], by_user.json()["role"]) == ("gus", None)
    assert (by_role.json()["user"], by_role.json()["role"]) == (None, "operator")
    assert again.json()["id"] == by_user.json()["id"]  # the user's grant, replaced
    grants = await cp.store.run(cp.directory.list_grants, agent.id)
    assert [(g.user, g.role, g.level.value) for g in grants] == [
        ("gus", None, "edit"),
        (None, "operator", "run"),
    ]


async def test_operators_see_only_their_own_sandboxes(plane) -> None:
    cp = plane.cp
    t1 = await plane.user("op1", "operator")
    await plane.user("op2", "operator")
    agent = await cp.store.run(lambda: cp.agents.create("ops", owner="admin"))
    await cp.store.run(lambda: cp.directory.grant_role(agent.id, "operator", level="run", by="t"))
    cp.sandbox_owners["sb-00000000000a"] = SandboxOwner("op2", agent.id, "p")
    async with plane.client(t1) as c:
        resp = await c.get("/v1/sandboxes/sb-00000000000a")
        assert resp.status_code == 403
        assert (await c.get("/v1/sandboxes")).json() == []
        for method, url in (
            ("DELETE", "/v1/sandboxes/sb-00000000000a"),
            ("GET", "/v1/sandboxes/sb-00000000000a/files?path=x"),
        ):
            assert (await c.request(method, url)).status_code == 403


async def test_builders_read_neither_secret_values_nor_the_audit_log(plane) -> None:
    token = await plane.user("bo", "builder")
    async with plane.client(plane.admin_token) as admin:
        await admin.put("/v1/secrets/crm_token", json={"value": "s3cr3t-value-xyz"})
    async with plane.client(token) as c:
        assert (await c.get("/v1/audit")).status_code == 403
        listed = await c.get("/v1/secrets")
        assert listed.status_code == 200 and "s3cr3t-value-xyz" not in listed.text
        one = await c.get("/v1/secrets/crm_token")
        assert one.status_code == 200 and "value" not in one.json()
        assert (await c.put("/v1/secrets/crm_token", json={"value": "mine"})).status_code == 403


async def test_bad_input_gets_clear_4xx(plane) -> None:
    async with plane.client(plane.admin_token) as c:
        malformed = await c.post(
            "/v1/users", content=b'{"username": ', headers={"content-type": "application/json"}
        )
        assert malformed.status_code == 400 and malformed.json()["code"] == "malformed_json"
        huge = await c.post(
            "/v1/users",
            content=b"x" * (2 * 1024 * 1024),
            headers={"content-type": "application/json"},
        )
        assert huge.status_code == 413
        bad_policy = await c.put(
            "/v1/policies/p",
            content=b"name: p\nresources: {memory: lots}\n",
            headers={"content-type": "application/yaml"},
        )
        assert bad_policy.status_code == 400
        assert "resources.memory" in bad_policy.json()["message"]
        # JSON is refused a repeated key as YAML is: the second `egress` must not replace the
        # first silently.
        repeated = await c.put(
            "/v1/policies/p",
            content=b'{"name": "p", "egress": {"default": "block"}, '
            b'"egress": {"default": "allow"}}',
            headers={"content-type": "application/json"},
        )
        assert (
            repeated.status_code == 400 and "duplicate key 'egress'" in repeated.json()["message"]
        )
        assert (await c.get("/v1/policies/p")).status_code == 404
        bad_service = await c.put(
            "/v1/services/s", json={"upstream": "ftp://x", "auth": "bearer", "secrets": ["a"]}
        )
        assert bad_service.status_code == 400 and "upstream" in bad_service.json()["message"]
    async with plane.client("aamp_not-a-token") as c:
        assert (await c.get("/v1/me")).json()["code"] == "unauthenticated"
    async with plane.client() as c:
        weird = await c.get("/v1/me", headers={"authorization": "Basic abc"})
        assert weird.status_code == 401


async def test_resources_given_directly_are_bounded_naming_each_field(plane) -> None:
    """An admin's sandbox with resources of its own: the bounds a policy has, named by field,
    refused before any sandbox is made (the plane boots nothing, and checks that)."""
    body = {"image": "base", "resources": {"cpus": 100, "memory_bytes": 1024, "pids": 4}}
    async with plane.client(plane.admin_token) as c:
        refused = await c.post("/v1/sandboxes", json=body)
    assert refused.status_code == 400 and refused.json()["code"] == "invalid_request"
    message = refused.json()["message"]
    assert "resources.cpus" in message and "(0, 64]" in message
    assert "resources.memory" in message and "64MiB" in message
    assert "resources.pids" in message and "[8, 65536]" in message


async def test_ones_own_password_changes_only_with_the_current_one(plane) -> None:
    """A token alone (stolen, say) cannot become the password: changing your own needs the
    current one, a wrong one is a recorded denial counted as a failed login; an admin still
    resets anyone else's without it."""
    cora = await plane.user("cora", "builder", "cora-password-1")
    await plane.user("vic", "operator", "vic-password-11")
    ada = await plane.user("ada", "admin", "ada-password-11")
    url = "/v1/users/cora/password"
    async with plane.client(cora) as c:
        bare = await c.put(url, json={"password": "cora-new-pass-2"})
        assert bare.status_code == 400 and bare.json()["code"] == "current_password_needed"
        assert "current_password" in bare.json()["message"]
        body = {"password": "cora-new-pass-2", "current_password": "a-guess-guess"}
        wrong = await c.put(url, json=body)
        assert wrong.status_code == 403 and wrong.json()["code"] == "wrong_password"
        assert (await c.get("/v1/me")).status_code == 200  # the token itself still works
        body["current_password"] = "cora-password-1"
        assert (await c.put(url, json=body)).status_code == 204
    async with plane.client() as c:
        old = {"username": "cora", "password": "cora-password-1"}
        assert (await c.post("/v1/session", json=old)).status_code == 401
        new = {"username": "cora", "password": "cora-new-pass-2"}
        assert (await c.post("/v1/session", json=new)).status_code == 200
    # Wrong current passwords count as failed logins: five since the last success lock it.
    async with plane.client(cora) as c:
        guess = {"password": "cora-new-pass-3", "current_password": "a-guess-guess"}
        for _ in range(5):
            assert (await c.put(url, json=guess)).status_code == 403
        guess["current_password"] = "cora-new-pass-2"
        locked = await c.put(url, json=guess)
        assert locked.status_code == 429
    async with plane.client(ada) as c:
        reset = await c.put("/v1/users/vic/password", json={"password": "vic-reset-pass-2"})
        assert reset.status_code == 204
        own = await c.put("/v1/users/ada/password", json={"password": "ada-new-pass-22"})
        assert own.status_code == 400
    with plane.cp.store.engine.connect() as conn:
        denied = (
            conn.execute(
                text(
                    "SELECT reason FROM audit_records WHERE action = 'user.password_change' "
                    "AND decision = 'deny' AND resource = 'user:cora' ORDER BY seq"
                )
            )
            .scalars()
            .all()
        )
    assert denied[:6] == ["the current password given is wrong"] * 6
    assert len(denied) == 7 and "too many" in denied[6]
