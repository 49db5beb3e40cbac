"""The builder's pages: agents, the draft edited in a form or as YAML, test runs of the draft,
the diff between two versions, publishing, and grants (who may view, run, edit).

The form and the YAML editor both become the definition the API's `PUT .../draft` reads; it
validates it (every problem with its field path), and each problem is shown at its field with
what was typed kept. YAML is read with the policy reader's rules (a repeated key refused).
"""

from __future__ import annotations

import difflib
from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from aamp.policy import load_yaml
from aamp.web.page import Page, PageError, back, create_named, field_errors
from aamp.web.run_pages import may

TOOLS = ("shell", "python", "files", "browser", "documents", "rag")
LIMITS = ("max_steps", "wall_time", "max_tokens", "tool_timeout", "approval_timeout")


async def build_home(request: Request, status: int = 200, **context: Any) -> Response:
    page = await Page.signed_in(request)
    agents = [a for a in await page.get("/v1/agents") if may(page, a["id"], "edit")]
    return page.render(
        "build.html",
        status,
        agents=agents,
        values=context.get("values", {}),
        errors=context.get("errors", {}),
    )


async def create_agent(request: Request) -> Response:
    _, name, answer, errors = await create_named(request, "/v1/agents")
    if answer.ok:
        return back(f"/build/agents/{answer.json()['id']}")
    return await build_home(request, answer.status, values={"name": name}, errors=errors)


def _as_form(definition: dict[str, Any]) -> dict[str, Any]:
    """A stored definition as the form's values."""
    model, limits = definition.get("model", {}), definition.get("limits", {})
    values: dict[str, Any] = {
        "endpoint": model.get("endpoint", ""),
        "model": model.get("name", ""),
        "system_prompt": definition.get("system_prompt", ""),
        "policy": definition.get("policy", ""),
        "tools": list(definition.get("tools", [])),
    }
    seconds = {
        "wall_time": "wall_time_seconds",
        "tool_timeout": "tool_timeout_seconds",
        "approval_timeout": "approval_timeout_seconds",
    }
    for name in LIMITS:
        value = limits.get(seconds.get(name, name), limits.get(name, ""))
        values[name] = f"{value}s" if name in seconds and isinstance(value, int) else value
    return values


def _definition_from_form(page: Page) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the definition to send, the values to show again). Numbers typed as digits are sent
    as numbers, anything else as typed, so the API's message names what is wrong."""
    assert page.form_data is not None
    values: dict[str, Any] = {
        k: page.text(k) for k in ("endpoint", "model", "system_prompt", "policy", *LIMITS)
    }
    values["tools"] = [str(t) for t in page.form_data.getlist("tools")]
    extra = [t.strip() for t in page.text("services").split(",") if t.strip()]
    values["services"] = page.text("services")
    limits: dict[str, Any] = {}
    for name in LIMITS:
        raw = values[name].strip()
        if raw:
            limits[name] = (
                int(raw) if raw.isdigit() and name in ("max_steps", "max_tokens") else raw
            )
    definition = {
        "model": {"endpoint": values["endpoint"], "name": values["model"]},
        "system_prompt": values["system_prompt"],
        "tools": [*values["tools"], *extra],
        "policy": values["policy"],
        "limits": limits,
    }
    return definition, values


async def editor(request: Request, status: int = 200, **context: Any) -> Response:
    page = context.pop("page", None) or await Page.signed_in(request)
    agent_id = request.path_params["agent_id"]
    agent = await page.get(f"/v1/agents/{agent_id}")
    versions = await page.get(f"/v1/agents/{agent_id}/versions")
    endpoints = await page.get("/v1/model-endpoints")
    policies = await page.get("/v1/policies")
    grants = await page.get(f"/v1/agents/{agent_id}/grants")
    resources = await page.get(f"/v1/agents/{agent_id}/resources")
    current = next(
        (v for v in versions if v["status"] == "draft"), versions[0] if versions else None
    )
    definition = current["definition"] if current else {}
    values = context.pop("values", None) or _as_form(definition)
    yaml_text = context.pop("yaml_text", None) or yaml.safe_dump(definition, sort_keys=False)
    return page.render(
        "builder.html",
        status,
        agent=agent,
        versions=versions,
        endpoints=endpoints,
        policies=policies,
        grants=grants,
        resources=resources,
        values=values,
        yaml_text=yaml_text,
        tools=TOOLS,
        mode=request.query_params.get("mode", context.pop("mode", "form")),
        errors=context.pop("errors", {}),
        grant_values=context.pop("grant_values", {}),
        grant_errors=context.pop("grant_errors", {}),
        **context,
    )


async def _save(page: Page, request: Request, definition: Any, **shown: Any) -> Response:
    agent_id = request.path_params["agent_id"]
    answer = await page.call("PUT", f"/v1/agents/{agent_id}/draft", json_body=definition)
    if answer.ok:
        return back(f"/build/agents/{agent_id}?saved=1&mode={shown.get('mode', 'form')}")
    if answer.status == 403:
        raise PageError(answer, me=page.me)
    errors = field_errors(answer.message) or {"": answer.message}
    return await editor(request, answer.status, page=page, errors=errors, **shown)


async def save_form(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    definition, values = _definition_from_form(page)
    return await _save(page, request, definition, values=values, mode="form")


async def save_yaml(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    text = page.text("definition")
    try:
        definition = load_yaml(text, "agent definition YAML")
    except ValueError as exc:
        return await editor(
            request, 400, page=page, errors={"yaml": str(exc)}, yaml_text=text, mode="yaml"
        )
    if not isinstance(definition, dict):
        return await editor(
            request,
            400,
            page=page,
            yaml_text=text,
            mode="yaml",
            errors={"yaml": "the definition must be a YAML mapping"},
        )
    return await _save(page, request, definition, yaml_text=text, mode="yaml")


async def publish(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    agent_id = request.path_params["agent_id"]
    answer = await page.call("POST", f"/v1/agents/{agent_id}/publish")
    if not answer.ok:
        if answer.status == 403:
            raise PageError(answer, me=page.me)
        return await editor(request, answer.status, page=page, errors={"": answer.message})
    return back(f"/build/agents/{agent_id}?published={answer.json()['version']}")


async def diff(request: Request) -> Response:
    page = await Page.signed_in(request)
    agent_id = request.path_params["agent_id"]
    a, b = request.query_params.get("a", ""), request.query_params.get("b", "draft")
    versions = await page.get(f"/v1/agents/{agent_id}/versions")
    texts = {}
    for which in (a, b):
        version = await page.get(f"/v1/agents/{agent_id}/versions/{which or 'latest'}")
        texts[which] = yaml.safe_dump(version["definition"], sort_keys=True).splitlines()
    lines = list(
        difflib.unified_diff(
            texts[a], texts[b], f"version {a or 'latest'}", f"version {b}", lineterm=""
        )
    )
    return page.render("diff.html", agent_id=agent_id, versions=versions, a=a, b=b, lines=lines)


async def add_grant(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    agent_id = request.path_params["agent_id"]
    who, level = page.text("who").strip(), page.text("level")
    body: dict[str, Any] = {"level": level}
    if who.startswith("role:"):
        body["role"] = who.removeprefix("role:")
    else:
        body["user"] = who
    answer = await page.call("POST", f"/v1/agents/{agent_id}/grants", json_body=body)
    if answer.ok:
        return back(f"/build/agents/{agent_id}#grants")
    return await editor(
        request,
        answer.status,
        page=page,
        grant_values={"who": who, "level": level},
        grant_errors={"who": answer.message},
    )


async def remove_grant(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    agent_id, grant_id = request.path_params["agent_id"], request.path_params["grant_id"]
    answer = await page.call("DELETE", f"/v1/agents/{agent_id}/grants/{grant_id}")
    if not answer.ok:
        raise PageError(answer, title="The grant was not removed", me=page.me)
    return back(f"/build/agents/{agent_id}#grants")


def routes() -> list[Route]:
    return [
        Route("/build", build_home, methods=["GET"]),
        Route("/build", create_agent, methods=["POST"]),
        Route("/build/agents/{agent_id}", editor, methods=["GET"]),
        Route("/build/agents/{agent_id}/draft", save_form, methods=["POST"]),
        Route("/build/agents/{agent_id}/yaml", save_yaml, methods=["POST"]),
        Route("/build/agents/{agent_id}/publish", publish, methods=["POST"]),
        Route("/build/agents/{agent_id}/diff", diff),
        Route("/build/agents/{agent_id}/grants", add_grant, methods=["POST"]),
        Route("/build/agents/{agent_id}/grants/{grant_id}/delete", remove_grant, methods=["POST"]),
    ]
