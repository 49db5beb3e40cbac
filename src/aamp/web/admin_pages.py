"""The admin's pages: users, policies (YAML editor and a summary of the five boundaries),
services, model endpoints, what each agent is granted, secrets (names and versions; values go
in and are never shown), images (the built ones; a build started and followed live), live
sandboxes, and the audit log (filters, pages by record number, JSONL export).

Whether a person may see or do any of it is the API's decision on each call: an operator who
types one of these addresses gets the API's refusal as a 403 page, and the refusal is in the
audit log like any other.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from aamp.policy import PolicyError, parse_policy
from aamp.web.page import ENV, Page, PageError, back, field_errors, list_with_form
from aamp.web.sse import relay, sse

AUDIT_FILTERS = ("actor", "action", "resource", "decision", "since", "until")
AUDIT_PAGE = 50
EXAMPLE_POLICY = """name: NAME
egress: {default: block, allow: [], deny: []}
services: []
image: base
data:
  inbound: {max_bytes: 50MB, types: [csv]}
  outbound: {max_bytes: 20MB, types: [csv, pdf], approval: false}
lifetime: {ttl: 15m, idle: 5m}
"""


def _refused(page: Page, answer: Any, title: str = "") -> None:
    """A refusal is a 403 page; other failures are shown on the form."""
    if answer.status in (403, 404):
        raise PageError(answer, title=title, me=page.me)


def _form_errors(page: Page, answer: Any, field: str) -> dict[str, str]:
    """What a refused form shows: a refusal is a page of its own (`_refused`); otherwise the
    API's errors by field, or its whole message on `field` when it names none of the form's."""
    _refused(page, answer)
    errors = field_errors(answer.message)
    if not errors or "" in errors:
        errors = {field: answer.message}
    return errors


# -- users -------------------------------------------------------------------------------


async def users(request: Request, status: int = 200, **context: Any) -> Response:
    return await list_with_form(request, "users", "admin_users.html", status, context)


async def create_user(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    values = {k: page.text(k).strip() for k in ("username", "role")}
    body = {**values, "password": page.text("password")}
    answer = await page.call("POST", "/v1/users", json_body=body)
    if answer.ok:
        return back("/admin/users")
    errors = _form_errors(page, answer, "username")
    return await users(request, answer.status, page=page, values=values, errors=errors)


async def update_user(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    username = request.path_params["username"]
    what = page.text("what")
    if what == "password":
        answer = await page.call(
            "PUT", f"/v1/users/{username}/password", json_body={"password": page.text("password")}
        )
    else:
        body: dict[str, Any] = {}
        if what == "role":
            body["role"] = page.text("role")
        else:
            body["disabled"] = what == "disable"
        answer = await page.call("PATCH", f"/v1/users/{username}", json_body=body)
    if answer.ok:
        return back("/admin/users")
    _refused(page, answer)
    return await users(
        request, answer.status, page=page, errors={f"user:{username}": answer.message}
    )


# -- policies ----------------------------------------------------------------------------


def summary(source: str) -> dict[str, Any] | None:
    """The five boundaries of a stored policy, as words for the page (None if unreadable)."""
    try:
        policy = parse_policy(source)
    except PolicyError:
        return None
    data, life, egress = policy.data, policy.lifetime, policy.egress

    def listed(items: Any, none: str) -> str:
        return ", ".join(map(str, items)) or none

    approval = data.outbound.approval_over
    outbound = "no approval" if approval is None else f"approval above {approval} bytes"
    return {
        "egress": f"default {egress.default}; allow {listed(egress.allow, 'nothing')}; "
        f"deny {listed(egress.deny, 'nothing')}",
        "services": listed(policy.services, "none"),
        "image": policy.image + (f" + {listed(policy.packages, '')}" if policy.packages else ""),
        "data": f"in: {listed(data.inbound.types, 'no types')} up to "
        f"{data.inbound.max_bytes} bytes; out: {listed(data.outbound.types, 'no types')} up to "
        f"{data.outbound.max_bytes} bytes, {outbound}",
        "lifetime": f"ttl {life.ttl_seconds} s, idle {life.idle_seconds} s",
    }


async def policies(request: Request, status: int = 200, **context: Any) -> Response:
    page = context.pop("page", None) or await Page.signed_in(request)
    found = await page.get("/v1/policies")
    rows = [{**p, "summary": summary(p["source"])} for p in found]
    return page.render(
        "admin_policies.html", status, policies=rows, errors=context.get("errors", {})
    )


# What each delete form removes: the API path its name goes under, and the page it is on.
DELETABLE = {
    "policies": ("/v1/policies", "/admin/policies"),
    "services": ("/v1/services", "/admin/catalog#services"),
    "model-endpoints": ("/v1/model-endpoints", "/admin/catalog#endpoints"),
}


def _delete_form(what: str) -> Callable[[Request], Awaitable[Response]]:
    api, shown_on = DELETABLE[what]

    async def delete_entry(request: Request) -> Response:
        """A delete form: the API deletes (or refuses, on record, what is in use); a refusal
        is shown at the entry's own row, everything else as it was."""
        page = await Page.signed_in(request)
        await page.form()
        name = request.path_params["name"]
        answer = await page.call("DELETE", f"{api}/{quote(name, safe='')}")
        if answer.ok:
            return back(shown_on)
        _refused(page, answer)
        errors = {f"delete:{what}:{name}": answer.message}
        listing = policies if what == "policies" else catalog
        return await listing(request, answer.status, page=page, errors=errors)

    return delete_entry


async def policy_editor(request: Request, status: int = 200, **context: Any) -> Response:
    page = context.pop("page", None) or await Page.signed_in(request)
    name = request.path_params.get("name", "")
    source = context.pop("source", None)
    if name:
        stored = (await page.get(f"/v1/policies/{name}"))["source"]
    else:
        await page.get("/v1/policies")  # the API's say on whether policies are for this person
        stored = EXAMPLE_POLICY
    source = stored if source is None else source
    return page.render(
        "admin_policy.html",
        status,
        name=name,
        source=source,
        summary=summary(source),
        errors=context.pop("errors", {}),
        values=context.pop("values", {"name": name}),
    )


async def save_policy(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    name = request.path_params.get("name") or page.text("name").strip()
    source = page.text("source")
    answer = (
        await page.call(
            "PUT", f"/v1/policies/{name}", body=source.encode(), content_type="application/yaml"
        )
        if name
        else None
    )
    if answer is not None and answer.ok:
        return back(f"/admin/policies/{name}?saved=1")
    if answer is None:
        errors = {"name": "name: give the policy a name"}
    else:
        _refused(page, answer)
        errors = field_errors(answer.message) or {"source": answer.message}
    return await policy_editor(
        request,
        400 if answer is None else answer.status,
        page=page,
        source=source,
        errors=errors,
        values={"name": name},
    )


# -- catalog lists, endpoints, agent resources ----------------------------------------------


async def catalog(request: Request, status: int = 200, **context: Any) -> Response:
    page = context.pop("page", None) or await Page.signed_in(request)
    return page.render(
        "admin_catalog.html",
        status,
        services=await page.get("/v1/services"),
        endpoints=await page.get("/v1/model-endpoints"),
        agents=await page.get("/v1/agents"),
        values=context.get("values", {}),
        errors=context.get("errors", {}),
        form=context.get("form", ""),
    )


async def _save_to_catalog(
    request: Request, page: Page, path: str, body: dict[str, Any], form: str, fields: tuple
) -> Response:
    """PUT a catalog entry; on failure the catalog page again, the form's values kept."""
    answer = await page.call("PUT", path, json_body=body)
    if answer.ok:
        return back(f"/admin/catalog#{form}")
    _refused(page, answer)
    first = fields[1]
    return await catalog(
        request,
        answer.status,
        page=page,
        form=form,
        values={k: page.text(k) for k in fields},
        errors=field_errors(answer.message) or {first: answer.message},
    )


async def save_endpoint(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    body: dict[str, Any] = {
        "base_url": page.text("base_url").strip(),
        "models": [m.strip() for m in page.text("models").split(",") if m.strip()],
    }
    if page.text("api_key_secret").strip():
        body["api_key_secret"] = page.text("api_key_secret").strip()
    path = f"/v1/model-endpoints/{page.text('name').strip() or '-'}"
    fields = ("name", "base_url", "models", "api_key_secret")
    return await _save_to_catalog(request, page, path, body, "endpoints", fields)


async def save_service(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    body: dict[str, Any] = {
        "upstream": page.text("upstream").strip(),
        "auth": page.text("auth"),
        "secrets": [n.strip() for n in page.text("secrets").split(",") if n.strip()],
    }
    if page.text("header_name").strip():
        body["header_name"] = page.text("header_name").strip()
    path = f"/v1/services/{page.text('name').strip() or '-'}"
    fields = ("name", "upstream", "auth", "secrets", "header_name")
    return await _save_to_catalog(request, page, path, body, "services", fields)


async def grant_resource(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    agent_id = page.text("agent")
    body = {"kind": page.text("kind"), "name": page.text("name").strip()}
    answer = await page.call("POST", f"/v1/agents/{agent_id}/resources", json_body=body)
    if not answer.ok:
        raise PageError(answer, title="Not granted", me=page.me)
    return back(f"/build/agents/{agent_id}#resources")


# -- secrets -------------------------------------------------------------------------------


async def secrets(request: Request, status: int = 200, **context: Any) -> Response:
    return await list_with_form(request, "secrets", "admin_secrets.html", status, context)


async def set_secret(request: Request) -> Response:
    """Set or rotate (a new version of) a secret; the value is never put back on a page,
    not even after an error."""
    page = await Page.signed_in(request)
    await page.form()
    name = page.text("name").strip()
    answer = await page.call(
        "PUT", f"/v1/secrets/{name or '-'}", json_body={"value": page.text("value")}
    )
    if answer.ok:
        return back("/admin/secrets")
    errors = _form_errors(page, answer, "name")
    return await secrets(request, answer.status, page=page, values={"name": name}, errors=errors)


# -- images ------------------------------------------------------------------------------


async def images(request: Request, status: int = 200, **context: Any) -> Response:
    """Built images and the builds since start (the latter admins' only: an operator who
    types this address gets the API's refusal as the 403 page)."""
    page = context.pop("page", None) or await Page.signed_in(request)
    builds = await page.get("/v1/image-builds")
    return await list_with_form(
        request, "images", "admin_images.html", status, {**context, "page": page}, builds=builds
    )


async def build_image(request: Request) -> Response:
    """Start a build; its page follows the progress live. A refusal (another build of the
    image is running, an unknown image) is shown at the form, which keeps what was typed."""
    page = await Page.signed_in(request)
    await page.form()
    name = page.text("name").strip()
    force = page.text("force") == "on"
    answer = await page.call(
        "POST", f"/v1/images/{quote(name or '-', safe='')}/build", json_body={"force": force}
    )
    if answer.ok:
        return back(f"/admin/images/{name}/build")
    if answer.status == 403:
        _refused(page, answer)
    values = {"name": name, "force": "on" if force else ""}
    errors = {"name": answer.message}
    return await images(request, answer.status, page=page, values=values, errors=errors)


async def image_build(request: Request) -> Response:
    page = await Page.signed_in(request)
    name = request.path_params["name"]
    build = await page.get(f"/v1/images/{quote(name, safe='')}/build")
    return page.render("admin_image_build.html", build=build)


async def image_build_stream(request: Request) -> Response:
    page = await Page.signed_in(request)
    name = request.path_params["name"]
    line = ENV.from_string("<li>{{ line }}</li>")
    state = ENV.get_template("image_build_state.html")

    async def translate(event: str, data: Any, event_id: str | None) -> list[bytes]:
        if event == "progress":
            return [sse("progress", line.render(line=data.get("line", "")), event_id)]
        return [sse("finished", state.render(build=data))]

    return await relay(page, f"/v1/images/{quote(name, safe='')}/build/events", translate)


# -- sandboxes ----------------------------------------------------------------------------


async def sandboxes(request: Request) -> Response:
    page = await Page.signed_in(request)
    return page.render("admin_sandboxes.html", sandboxes=await page.get("/v1/sandboxes"))


async def destroy_sandbox(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    answer = await page.call("DELETE", f"/v1/sandboxes/{request.path_params['sandbox_id']}")
    if not answer.ok:
        raise PageError(answer, title="The sandbox was not destroyed", me=page.me)
    return back("/sandboxes")


# -- audit -------------------------------------------------------------------------------


def _audit_query(request: Request) -> dict[str, str]:
    return {k: request.query_params.get(k, "") for k in AUDIT_FILTERS}


async def audit(request: Request) -> Response:
    """A page of the log by record number (`after_seq`): an index range, whatever its size."""
    filters = _audit_query(request)
    after = request.query_params.get("after_seq", "0")
    query = {**filters, "after_seq": after, "limit": AUDIT_PAGE}
    page, (answer,) = await Page.signed_in_reading(request, ("/v1/audit", query))
    if not answer.ok:
        _refused(page, answer)
        return page.render(
            "admin_audit.html",
            answer.status,
            records=[],
            next_after=None,
            filters=filters,
            errors=field_errors(answer.message) or {"": answer.message},
            export="",
        )
    data = answer.json()
    verified = await page.get("/v1/audit/verify") if request.query_params.get("verify") else None
    export = urlencode({k: v for k, v in filters.items() if v})
    next_query = (
        urlencode({**{k: v for k, v in filters.items() if v}, "after_seq": data["next_after_seq"]})
        if data["next_after_seq"]
        else None
    )
    return page.render(
        "admin_audit.html",
        records=data["records"],
        next_query=next_query,
        filters=filters,
        errors={},
        export=export,
        verified=verified,
    )


async def audit_export(request: Request) -> Response:
    """The filtered log as JSON lines, read page by page from the API."""
    page = await Page.signed_in(request)
    filters = _audit_query(request)
    first = await page.call("GET", "/v1/audit", query={**filters, "limit": 1000})
    if not first.ok:
        raise PageError(first, title="No export", me=page.me)

    async def lines() -> AsyncIterator[bytes]:
        data = first.json()
        while True:
            for record in data["records"]:
                yield json.dumps(record, separators=(",", ":")).encode() + b"\n"
            if not data["next_after_seq"]:
                return
            more = await page.call(
                "GET",
                "/v1/audit",
                query={**filters, "limit": 1000, "after_seq": data["next_after_seq"]},
            )
            if not more.ok:
                return
            data = more.json()

    return StreamingResponse(
        lines(),
        media_type="application/x-ndjson",
        headers={"content-disposition": 'attachment; filename="aamp-audit.jsonl"'},
    )


def routes() -> list[Route]:
    return [
        Route("/admin/users", users, methods=["GET"]),
        Route("/admin/users", create_user, methods=["POST"]),
        Route("/admin/users/{username}", update_user, methods=["POST"]),
        Route("/admin/policies", policies, methods=["GET"]),
        Route("/admin/policies/new", policy_editor, methods=["GET"]),
        Route("/admin/policies/new", save_policy, methods=["POST"]),
        Route("/admin/policies/{name}", policy_editor, methods=["GET"]),
        Route("/admin/policies/{name}", save_policy, methods=["POST"]),
        Route("/admin/catalog", catalog, methods=["GET"]),
        Route("/admin/model-endpoints", save_endpoint, methods=["POST"]),
        Route("/admin/services", save_service, methods=["POST"]),
        Route("/admin/agent-resources", grant_resource, methods=["POST"]),
        Route("/admin/policies/{name}/delete", _delete_form("policies"), methods=["POST"]),
        Route("/admin/services/{name}/delete", _delete_form("services"), methods=["POST"]),
        Route(
            "/admin/model-endpoints/{name}/delete",
            _delete_form("model-endpoints"),
            methods=["POST"],
        ),
        Route("/admin/secrets", secrets, methods=["GET"]),
        Route("/admin/secrets", set_secret, methods=["POST"]),
        Route("/admin/images", images, methods=["GET"]),
        Route("/admin/images", build_image, methods=["POST"]),
        Route("/admin/images/{name}/build", image_build, methods=["GET"]),
        Route("/admin/images/{name}/build/stream", image_build_stream, methods=["GET"]),
        Route("/sandboxes", sandboxes, methods=["GET"]),
        Route("/sandboxes/{sandbox_id}/destroy", destroy_sandbox, methods=["POST"]),
        Route("/admin/audit", audit, methods=["GET"]),
        Route("/admin/audit/export", audit_export, methods=["GET"]),
    ]
