"""The authorisation matrix: every route the app has (walked from `app.routes`, every kind of
route — not the OpenAPI document, which can leave routes out) × every role × each grant
level on the agent (none, view, run, edit) × each kind of target (own or someone else's),
with the exact allow/deny expected written out here, independently of `aamp.identity.authz`.

A route without an entry in `EXPECTED` fails the test; so does a route without a rule in the
code (the guard denies it, and an admin's "allow" is then wrong), and so does a route that
answers without a decision on record (it would be outside the guard). Every denial is the
guard's one record and its 401/403: no route refuses on its own after an "allow".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

ROLES = ("anonymous", "admin", "builder", "operator")
LEVELS = (None, "view", "run", "edit")
RANK = {None: 0, "view": 1, "run": 2, "edit": 3}


@dataclass(frozen=True)
class Who:
    role: str
    level: str | None  # the user grant this actor holds on its agent

    @property
    def signed_in(self) -> bool:
        return self.role != "anonymous"

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def has(self, needed: str) -> bool:
        if self.admin:
            return True
        if not self.signed_in:
            return False
        level = self.level
        if self.role == "operator" and RANK[level] > RANK["run"]:
            level = "run"  # operators never get more than run
        return RANK[level] >= RANK[needed]


Expect = Callable[[Who], bool]


def anyone(_: Who) -> bool:
    return True


def signed_in(w: Who) -> bool:
    return w.signed_in


def admin(w: Who) -> bool:
    return w.admin


def staff(w: Who) -> bool:
    return w.role in ("admin", "builder")


def never(_: Who) -> bool:
    return False


def level(needed: str) -> Expect:
    return lambda w: w.has(needed)


# (method, path template) -> {variant: expected}. Variants name the target: "own" is the
# actor's own user/token/sandbox, "other" someone else's.
EXPECTED: dict[tuple[str, str], dict[str, Expect]] = {
    ("GET", "/openapi.json"): {"-": signed_in},
    ("GET", "/v1/health"): {"-": anyone},
    ("POST", "/v1/session"): {"-": anyone},
    ("DELETE", "/v1/session"): {"-": signed_in},
    ("GET", "/v1/me"): {"-": signed_in},
    ("GET", "/v1/users"): {"-": admin},
    ("POST", "/v1/users"): {"-": admin},
    ("GET", "/v1/users/{username}"): {"own": signed_in, "other": admin},
    ("PATCH", "/v1/users/{username}"): {"own": never, "other": admin},
    ("PUT", "/v1/users/{username}/password"): {"own": signed_in, "other": admin},
    ("GET", "/v1/tokens"): {"-": signed_in},
    ("POST", "/v1/tokens"): {"-": signed_in},
    ("DELETE", "/v1/tokens/{token_id}"): {"own": signed_in, "other": admin},
    ("POST", "/v1/users/{username}/tokens"): {"own": admin, "other": admin},
    ("GET", "/v1/agents"): {"-": signed_in},
    ("POST", "/v1/agents"): {"-": staff},
    ("GET", "/v1/agents/{agent_id}"): {"-": level("view")},
    ("DELETE", "/v1/agents/{agent_id}"): {"-": level("edit")},
    ("GET", "/v1/agents/{agent_id}/grants"): {"-": level("edit")},
    ("POST", "/v1/agents/{agent_id}/grants"): {
        "other": level("edit"),
        "own": never,
        "own-role": never,
    },
    ("DELETE", "/v1/agents/{agent_id}/grants/{grant_id}"): {"-": level("edit")},
    ("GET", "/v1/agents/{agent_id}/resources"): {"-": level("view")},
    ("POST", "/v1/agents/{agent_id}/resources"): {"-": admin},
    ("DELETE", "/v1/agents/{agent_id}/resources/{kind}/{name}"): {"-": admin},
    ("GET", "/v1/policies"): {"-": staff},
    ("GET", "/v1/policies/{name}"): {"-": staff},
    ("PUT", "/v1/policies/{name}"): {"-": admin},
    ("DELETE", "/v1/policies/{name}"): {"-": admin},
    ("GET", "/v1/services"): {"-": staff},
    ("GET", "/v1/services/{name}"): {"-": staff},
    ("PUT", "/v1/services/{name}"): {"-": admin},
    ("DELETE", "/v1/services/{name}"): {"-": admin},
    ("GET", "/v1/model-endpoints"): {"-": staff},
    ("GET", "/v1/model-endpoints/{name}"): {"-": staff},
    ("PUT", "/v1/model-endpoints/{name}"): {"-": admin},
    ("DELETE", "/v1/model-endpoints/{name}"): {"-": admin},
    ("POST", "/v1/model-endpoints/{name}/confirm"): {"-": admin},
    ("GET", "/v1/secrets"): {"-": staff},
    ("GET", "/v1/secrets/{name}"): {"-": staff},
    ("PUT", "/v1/secrets/{name}"): {"-": admin},
    ("DELETE", "/v1/secrets/{name}"): {"-": admin},
    ("POST", "/v1/vault/rotate"): {"-": admin},
    ("GET", "/v1/audit"): {"-": admin},
    ("GET", "/v1/audit/verify"): {"-": admin},
    ("GET", "/v1/images"): {"-": signed_in},
    ("GET", "/v1/image-builds"): {"-": admin},
    ("POST", "/v1/images/{name}/build"): {"-": admin},
    ("GET", "/v1/images/{name}/build"): {"-": admin},
    ("GET", "/v1/images/{name}/build/events"): {"-": admin},
    ("GET", "/v1/knowledge-bases"): {"-": staff},
    ("POST", "/v1/knowledge-bases"): {"-": staff},
    ("GET", "/v1/knowledge-bases/{name}"): {"-": staff},
    ("DELETE", "/v1/knowledge-bases/{name}"): {"-": staff},
    ("PUT", "/v1/knowledge-bases/{name}/documents/{document}"): {"-": staff},
    ("DELETE", "/v1/knowledge-bases/{name}/documents/{document}"): {"-": staff},
    ("GET", "/v1/wheelhouse"): {"-": staff},
    ("POST", "/v1/wheelhouse"): {"-": admin},
    ("PUT", "/v1/wheelhouse/wheels/{filename}"): {"-": admin},
    ("DELETE", "/v1/wheelhouse/{name}"): {"-": admin},
    ("GET", "/v1/hosts"): {"-": admin},
    ("POST", "/v1/hosts"): {"-": admin},
    ("POST", "/v1/hosts/{host_id}/drain"): {"-": admin},
    ("DELETE", "/v1/hosts/{host_id}"): {"-": admin},
    # a host's own calls: its token is checked by the route, as a password is
    ("POST", "/v1/hosts/{host_id}/register"): {"-": anyone},
    ("POST", "/v1/hosts/{host_id}/heartbeat"): {"-": anyone},
    ("GET", "/v1/sandboxes"): {"-": signed_in},
    # A sandbox for an agent uses only what is granted to that agent, whoever asks; only
    # admins give a policy inline or make one without an agent and policy.
    ("POST", "/v1/sandboxes"): {
        "granted-policy": level("run"),
        "ungranted-policy": never,
        "ungranted-service": never,
        "inline-policy": admin,
        "no-agent": admin,
        "no-policy": admin,
    },
    ("GET", "/v1/sandboxes/{sandbox_id}"): {"own": level("run"), "other": admin},
    ("DELETE", "/v1/sandboxes/{sandbox_id}"): {"own": level("run"), "other": admin},
    ("POST", "/v1/sandboxes/{sandbox_id}/exec"): {"own": level("run"), "other": admin},
    ("PUT", "/v1/sandboxes/{sandbox_id}/files"): {"own": level("run"), "other": admin},
    ("GET", "/v1/sandboxes/{sandbox_id}/files"): {"own": level("run"), "other": admin},
    ("POST", "/v1/sandboxes/{sandbox_id}/screenshot"): {"own": level("run"), "other": admin},
    # agent versions: view reads published ones, edit also the draft and unpublished numbers,
    # saves and publishes the draft
    ("GET", "/v1/agents/{agent_id}/versions"): {"-": level("view")},
    ("GET", "/v1/agents/{agent_id}/versions/{version}"): {
        "latest": level("view"),
        "draft": level("edit"),
        "unpublished-number": level("edit"),
    },
    ("PUT", "/v1/agents/{agent_id}/draft"): {"-": level("edit")},
    ("POST", "/v1/agents/{agent_id}/publish"): {"-": level("edit")},
    # runs: published versions started with run, the draft and unpublished numbers with edit;
    # seen by their owner (with run), editors of the agent and admins
    ("POST", "/v1/agents/{agent_id}/runs"): {
        "latest": level("run"),
        "draft": level("edit"),
        "unpublished-number": level("edit"),
    },
    # what a run's inputs may be: to exactly those who may start that run
    ("GET", "/v1/agents/{agent_id}/inbound"): {
        "latest": level("run"),
        "draft": level("edit"),
        "unpublished-number": level("edit"),
    },
    ("GET", "/v1/runs"): {"-": signed_in},
    ("GET", "/v1/runs/{run_id}"): {"own": level("run"), "other": level("edit")},
    ("GET", "/v1/runs/{run_id}/events"): {"own": level("run"), "other": level("edit")},
    ("POST", "/v1/runs/{run_id}/cancel"): {"own": level("run"), "other": level("edit")},
    ("GET", "/v1/runs/{run_id}/artifacts"): {"own": level("run"), "other": level("edit")},
    ("GET", "/v1/runs/{run_id}/artifacts/{name}"): {
        "own": level("run"),
        "other": level("edit"),
    },
    ("GET", "/v1/approvals"): {"-": signed_in},
    # a run's approval requests are answered by those who see the run for its owner
    ("POST", "/v1/approvals/{approval_id}"): {"own": level("run"), "other": level("edit")},
}

# Routes that destroy the actor's agent run last in each scenario.
LAST = {("DELETE", "/v1/agents/{agent_id}")}


@dataclass
class Scenario:
    who: Who
    username: str | None
    token: str | None
    agent: str
    spare_token: str
    grant_id: int
    own_sandbox: str
    other_sandbox: str
    own_run: str = "run-none"
    other_run: str = "run-none"
    approval: str = "ap-none"
    other_approval: str = "ap-none"


def records_of(cp: Any, request_id: str) -> list[tuple[str, str]]:
    """(action, decision) of every audit record a request left, in order."""
    from sqlalchemy import text

    with cp.store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT action, decision FROM audit_records WHERE request_id = :r ORDER BY seq"),
            {"r": request_id},
        ).all()
    return [(a, d) for a, d in rows]


def request_for(
    method: str, path: str, variant: str, sc: Scenario, ctx: dict[str, Any], n: int
) -> tuple[str, dict[str, Any]]:
    """The concrete URL and request arguments for one route, variant and scenario."""
    me = sc.username or "nobody"
    values = {
        "username": me if variant == "own" else ctx["victim"],
        "token_id": sc.spare_token if variant == "own" else ctx["victim_token"],
        "agent_id": sc.agent,
        "grant_id": str(sc.grant_id),
        "kind": "image",
        "name": "scratch",
        "sandbox_id": sc.own_sandbox if variant == "own" else sc.other_sandbox,
        "run_id": sc.own_run if variant == "own" else sc.other_run,
        "approval_id": sc.approval if variant == "own" else sc.other_approval,
        "filename": "scratch-1.0-py3-none-any.whl",
        "host_id": "scratch-host",
        "document": "notes.md",
        "version": {"draft": "draft", "unpublished-number": "5"}.get(variant, "latest"),
    }
    if path.startswith("/v1/agents/{agent_id}/resources/"):
        values["name"] = "docs"
    if path.startswith("/v1/secrets/"):
        values["name"] = "scratch_secret"
    url = path.format(**values)
    kw: dict[str, Any] = {}
    body: dict[tuple[str, str], Any] = {
        ("POST", "/v1/session"): {"username": "nobody-at-all", "password": "wrong-password"},
        ("POST", "/v1/users"): {"username": f"new{n}", "role": "operator", "password": "x" * 16},
        ("PATCH", "/v1/users/{username}"): {"disabled": False},
        ("PUT", "/v1/users/{username}/password"): {"password": "a-new-password-1"},
        ("POST", "/v1/tokens"): {"name": "matrix"},
        ("POST", "/v1/users/{username}/tokens"): {"name": "matrix"},
        ("POST", "/v1/agents"): {"name": f"agent-new{n}"},
        ("POST", "/v1/knowledge-bases"): {"name": f"kb-new{n}"},
        ("POST", "/v1/agents/{agent_id}/resources"): {"kind": "image", "name": "docs"},
        ("PUT", "/v1/services/{name}"): {
            "upstream": "https://crm.internal.example",
            "auth": "bearer",
            "secrets": ["crm_token"],
        },
        ("PUT", "/v1/secrets/{name}"): {"value": "scratch value"},
        ("PUT", "/v1/model-endpoints/{name}"): {"base_url": "http://127.0.0.1:9/v1"},
        ("POST", "/v1/sandboxes/{sandbox_id}/exec"): {"argv": ["true"]},
        ("POST", "/v1/sandboxes/{sandbox_id}/screenshot"): {"url": "http://app.test/"},
        ("PUT", "/v1/agents/{agent_id}/draft"): {"tools": ["nonsense"]},
        ("POST", "/v1/approvals/{approval_id}"): {"decision": "deny"},
        ("POST", "/v1/hosts"): {"id": f"host-new{n}"},
        ("POST", "/v1/hosts/{host_id}/register"): {
            "drivers": ["gvisor"],
            "cpus": 1,
            "memory_mb": 512,
            "sandboxes": 1,
        },
        ("POST", "/v1/hosts/{host_id}/heartbeat"): {"epoch": 1},
    }
    if (method, path) in body:
        kw["json"] = body[(method, path)]
    if (method, path) == ("POST", "/v1/agents/{agent_id}/grants"):
        kw["json"] = {
            "other": {"user": ctx["victim"], "level": "view"},
            "own": {"user": me, "level": "edit"},
            "own-role": {"role": sc.who.role if sc.who.signed_in else "admin", "level": "edit"},
        }[variant]
    if (method, path) == ("POST", "/v1/agents/{agent_id}/runs"):
        version = {"draft": "draft", "unpublished-number": 5}.get(variant, "latest")
        kw["json"] = {"task": "matrix", "version": version}
    if (method, path) == ("GET", "/v1/agents/{agent_id}/inbound"):
        kw["params"] = {
            "version": {"draft": "draft", "unpublished-number": "5"}.get(variant, "latest")
        }
    if (method, path) == ("POST", "/v1/sandboxes"):
        kw["json"] = {
            "granted-policy": {"agent": sc.agent, "policy": "p1"},
            "ungranted-policy": {"agent": sc.agent, "policy": "p2"},
            "ungranted-service": {"agent": sc.agent, "policy": "p3"},
            "inline-policy": {
                "agent": sc.agent,
                "policy": "p1",
                "policy_document": "name: inline\nimage: base\n",
            },
            "no-agent": {"image": "base"},
            "no-policy": {"agent": sc.agent},
        }[variant]
    if (method, path) == ("PUT", "/v1/policies/{name}"):
        kw["json"] = {"name": "scratch"}
    if path.startswith("/v1/hosts/{host_id}/"):
        kw["headers"] = {"x-aamp-host-token": "aamph_not-a-host-token"}
    if path.endswith("/files"):
        kw["params"] = {"path": "x.txt"}
        if method == "PUT":
            kw["content"] = b"hello"
    return url, kw


def routes_of(app: Any) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves, of every kind (included routers' routes
    too): a WebSocket route is ("WEBSOCKET", path), a mount or anything else ("MOUNT", path) —
    none of which EXPECTED allows, so such a route fails the test until it is given a rule
    and an expectation."""
    from fastapi.routing import iter_route_contexts
    from starlette.routing import Route, WebSocketRoute

    found: set[tuple[str, str]] = set()
    for route in iter_route_contexts(app.routes):
        path = route.path_format or route.path or repr(route.original_route)
        if isinstance(route.original_route, Route):
            found.update((method, path) for method in route.methods or ())
        elif isinstance(route.original_route, WebSocketRoute):
            found.add(("WEBSOCKET", path))
        else:
            found.add(("MOUNT", path))
    return found


async def test_every_route_has_exactly_the_expected_outcome(plane) -> None:
    cp = plane.cp
    served = routes_of(plane.app)
    assert served - set(EXPECTED) == set(), "routes without an expected outcome"
    assert set(EXPECTED) - served == set(), "expectations for routes that do not exist"

    from aamp.api.context import SandboxOwner
    from aamp.runs.store import RunStore

    runs = RunStore(cp.store)

    admin = plane.admin_token
    async with plane.client(admin) as c:
        assert (await c.put("/v1/secrets/crm_token", json={"value": "v"})).status_code == 200
        service = {"upstream": "https://crm.test", "auth": "bearer", "secrets": ["crm_token"]}
        assert (await c.put("/v1/services/crm", json=service)).status_code == 200
        for body in (
            {"name": "p1", "image": "base"},
            {"name": "p2", "image": "base"},
            {"name": "p3", "image": "base", "services": ["crm"]},
        ):
            assert (await c.put(f"/v1/policies/{body['name']}", json=body)).status_code == 200
    victim_token = await plane.user("victim", "operator")
    ctx = {
        "victim": "victim",
        "victim_token": (await cp.store.run(cp.directory.list_tokens, "victim"))[0].id,
    }
    del victim_token

    scenarios: list[Scenario] = []
    who_list = [Who("anonymous", None), Who("admin", None)] + [
        Who(role, lvl) for role in ("builder", "operator") for lvl in LEVELS
    ]
    for i, who in enumerate(who_list):
        agent = await cp.store.run(lambda i=i: cp.agents.create(f"a{i}", owner="admin"))
        for kind, name in (("policy", "p1"), ("policy", "p3"), ("image", "base")):
            await cp.store.run(
                lambda k=kind, nm=name, a=agent.id: cp.catalog.grant_resource(a, k, nm, by="t")
            )
        victim_grant = await cp.store.run(
            lambda a=agent.id: cp.directory.grant_user(a, "victim", level="view", by="t")
        )
        username, token, spare = None, None, "tok-none"
        if who.role == "admin":
            username, token = "admin", admin
        elif who.signed_in:
            username = f"{who.role}-{who.level or 'none'}"
            token = await plane.user(username, who.role)
            if who.level:
                await cp.store.run(
                    lambda a=agent.id, u=username, lv=who.level: cp.directory.grant_user(
                        a, u, level=lv, by="t"
                    )
                )
        if username:
            made, _ = await cp.store.run(lambda u=username: cp.directory.create_token(u, "spare"))
            spare = made.id
        own_sb, other_sb = f"sb-{i:012x}", f"sb-{i + 100:012x}"
        own_run = await cp.store.run(
            lambda a=agent.id, u=username: runs.create(a, 1, u or "nobody", "t")
        )
        other_run = await cp.store.run(lambda a=agent.id: runs.create(a, 1, "victim", "t"))
        for made_run in (own_run, other_run):
            await cp.store.run(lambda r=made_run: runs.update(r.id, status="succeeded"))
            # Ended as a run ends, with its last step: a follower of its events reads to
            # `run.finished` and the stream closes (without it, one keep-alive wait apiece).
            await cp.runs.emit(made_run.id, "run.finished", {"status": "succeeded"})
        asked, other_asked = [
            await cp.store.run(
                lambda r=made_run: runs.request_approval(r.id, "data.outbound", {"name": "x.csv"})
            )
            for made_run in (own_run, other_run)
        ]
        scenarios.append(
            Scenario(
                who,
                username,
                token,
                agent.id,
                spare,
                victim_grant.id,
                own_sb,
                other_sb,
                own_run.id,
                other_run.id,
                asked["id"],
                other_asked["id"],
            )
        )

    routes = sorted(EXPECTED, key=lambda r: (r in LAST, r[1], r[0]))
    wrong: list[str] = []
    n = 0
    for sc in scenarios:
        async with plane.client(sc.token) as c:
            for method, path in routes:
                for variant, expect in EXPECTED[(method, path)].items():
                    n += 1
                    url, kw = request_for(method, path, variant, sc, ctx, n)
                    # Ownership of the (never booted) sandboxes; listing prunes unknown ids.
                    cp.sandbox_owners[sc.own_sandbox] = SandboxOwner(
                        sc.username or "", sc.agent, "p1"
                    )
                    cp.sandbox_owners[sc.other_sandbox] = SandboxOwner("victim", sc.agent, "p1")
                    resp = await c.request(method, url, **kw)
                    rid = resp.headers["x-request-id"]
                    records = records_of(cp, rid)
                    decision = records[0][1] if records else None
                    want = expect(sc.who)
                    denied_status = 403 if sc.who.signed_in else 401
                    # A denial is exactly 401/403 and the guard's one record; an allowed
                    # request may still fail in the route (404, 400, a wrong password's 401)
                    # but never with 403, nor with a later record refusing the same action.
                    ok = decision == ("allow" if want else "deny") and (
                        resp.status_code != 403 and (records[0][0], "deny") not in records[1:]
                        if want
                        else resp.status_code == denied_status and len(records) == 1
                    )
                    if not ok:
                        wrong.append(
                            f"{sc.who} {method} {path} [{variant}]: expected "
                            f"{'allow' if want else 'deny'}, got {decision} / "
                            f"HTTP {resp.status_code} {resp.text[:120]}"
                        )
    assert wrong == [], "\n".join(wrong)


async def test_a_route_without_a_rule_is_denied_even_to_an_admin(plane) -> None:
    from fastapi import APIRouter

    extra = APIRouter()

    @extra.get("/v1/unruled")
    async def unruled() -> dict[str, str]:
        return {"leak": "yes"}

    plane.app.include_router(extra)
    async with plane.client(plane.admin_token) as c:
        resp = await c.get("/v1/unruled")
    assert resp.status_code == 403
    assert "no authorisation rule" in resp.json()["message"]
    assert plane.decision(resp.headers["x-request-id"]) == "deny"
    # ...and the matrix test would fail for it, since EXPECTED has no entry.
    assert ("GET", "/v1/unruled") not in EXPECTED


def test_an_app_with_a_route_outside_the_guard_is_not_built() -> None:
    """A plain Starlette route (FastAPI's own docs routes are such) never passes the guard,
    and an API route without a rule would only ever be denied: neither is built."""
    from fastapi import APIRouter, FastAPI

    from aamp.api.app import _check_every_route_is_guarded
    from aamp.api.guard import guarded_router, rule

    async def page(_: object) -> None:
        return None

    outside = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    outside.add_route("/docs", page)
    with pytest.raises(RuntimeError, match="/docs is not behind the guard"):
        _check_every_route_is_guarded(outside)
    unruled = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    unruled.get("/v1/x")(page)
    with pytest.raises(RuntimeError, match="/v1/x is not behind the guard"):
        _check_every_route_is_guarded(unruled)
    # A ruled route whose dependencies lack the guard (a plain router's routes added to the
    # app, as `create_app` adds the modules' routes) would answer without a decision.
    unguarded = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    plain = APIRouter()
    plain.get("/v1/x")(rule("health.read")(page))
    unguarded.router.routes.extend(plain.routes)
    with pytest.raises(RuntimeError, match="/v1/x is not behind the guard"):
        _check_every_route_is_guarded(unguarded)
    ruled = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    module = guarded_router()
    module.get("/v1/x")(rule("health.read")(page))
    ruled.router.routes.extend(module.routes)
    _check_every_route_is_guarded(ruled)


@pytest.mark.parametrize("role", ["admin", "builder", "operator"])
def test_matrix_roles_are_the_product_roles(role: str) -> None:
    from aamp.identity import Role

    assert Role(role).value == role
