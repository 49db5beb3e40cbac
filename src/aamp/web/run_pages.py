"""The operator's pages: the agents one may run, starting a run (task and input files), the
live run view, cancelling, artifacts, run history, and answering approvals.

The live view is the API's own event stream (`/v1/runs/{id}/events`), relayed event by event
as HTML fragments (`sse.py`), which htmx's SSE extension appends to the page as they arrive;
a step is never shown twice or lost. When the run ends, a last event replaces the run's status
and artifacts and closes the stream.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from aamp.store.tables import RUN_STATUSES
from aamp.web.page import ENV, Page, PageError, back, field_errors, local_path
from aamp.web.sse import relay, sse

PAGE_SIZE = 25
LEVELS = {"view": 1, "run": 2, "edit": 3}


def may(page: Page, agent_id: str, level: str) -> bool:
    return page.role == "admin" or LEVELS.get(page.level(agent_id), 0) >= LEVELS[level]


async def agents(request: Request) -> Response:
    page = await Page.signed_in(request)
    found = await page.get("/v1/agents")
    rows = [{**a, "level": "edit" if page.role == "admin" else page.level(a["id"])} for a in found]
    return page.render("agents.html", agents=rows)


async def _run_form(page: Page, agent_id: str, status: int = 200, **context: Any) -> Response:
    agent = await page.get(f"/v1/agents/{agent_id}")
    versions = await page.get(f"/v1/agents/{agent_id}/versions")
    published = [v for v in versions if v["status"] == "published"]
    return page.render(
        "run_new.html",
        status,
        agent=agent,
        published=published,
        can_edit=may(page, agent_id, "edit"),
        values=context.pop("values", {}),
        errors=context.pop("errors", {}),
        **context,
    )


async def run_form(request: Request) -> Response:
    page = await Page.signed_in(request)
    return await _run_form(page, request.path_params["agent_id"])


async def start_run(request: Request) -> Response:
    """The form's files become the API's JSON inputs; the API checks them against the policy's
    `data.inbound` (type and size) before anything enters a sandbox, naming the rule."""
    page = await Page.signed_in(request)
    agent_id = request.path_params["agent_id"]
    form = await page.form()
    task, version = page.text("task"), page.text("version", "latest") or "latest"
    inputs = []
    for item in form.getlist("inputs"):
        if isinstance(item, UploadFile) and item.filename:
            data = await item.read()
            inputs.append({"name": item.filename, "content_b64": base64.b64encode(data).decode()})
    body: dict[str, Any] = {
        "task": task,
        "inputs": inputs,
        "version": int(version) if version.isdigit() else version,
    }
    answer = await page.call("POST", f"/v1/agents/{agent_id}/runs", json_body=body)
    if answer.ok:
        return back(f"/runs/{answer.json()['id']}")
    errors = field_errors(answer.message)
    if answer.code in ("data_refused", "too_large"):
        errors = {"inputs": answer.message}
    if answer.status == 403:
        raise PageError(answer, me=page.me)
    return await _run_form(
        page, agent_id, answer.status, values={"task": task, "version": version}, errors=errors
    )


async def runs(request: Request) -> Response:
    """Run history: filter by agent and status; pages by the last run shown (newest first)."""
    agent, status = request.query_params.get("agent", ""), request.query_params.get("status", "")
    query = {"agent": agent, "status": status, "limit": PAGE_SIZE}
    query["before"] = request.query_params.get("before", "")
    page, (answer, agents) = await Page.signed_in_reading(
        request, ("/v1/runs", query), ("/v1/agents", {})
    )
    for read in (answer, agents):
        if not read.ok:
            raise PageError(read, me=page.me)
    shown, more = answer.json(), answer.headers.get("x-next-before")
    agent_ids = [a["id"] for a in agents.json()]
    return page.render(
        "runs.html",
        runs=shown,
        more=more,
        agent=agent,
        status_filter=status,
        agent_ids=agent_ids,
        statuses=RUN_STATUSES,
    )


async def _panel(page: Page, run_id: str) -> dict[str, Any]:
    run = await page.get(f"/v1/runs/{run_id}")
    artifacts = await page.get(f"/v1/runs/{run_id}/artifacts")
    return {"run": run, "artifacts": artifacts}


async def run_view(request: Request) -> Response:
    page = await Page.signed_in(request)
    run_id = request.path_params["run_id"]
    panel = await _panel(page, run_id)
    return page.render("run.html", **panel)


async def _answerable(page: Page, run_id: str, approval_id: Any) -> dict[str, Any] | None:
    """The approval request as this person may answer it (its status says whether it still
    waits), or None when they may not: the API lists only those `allowed()` lets them decide."""
    mine = await page.get("/v1/approvals", run_id=run_id, pending="false")
    return next((a for a in mine if a["id"] == approval_id), None)


async def run_stream(request: Request) -> Response:
    page = await Page.signed_in(request)
    run_id = request.path_params["run_id"]
    run = await page.get(f"/v1/runs/{run_id}")
    step = ENV.get_template("step.html")
    csrf = request.cookies.get("aamp_csrf", "")

    async def translate(event: str, data: Any, event_id: str | None) -> list[bytes]:
        answerable = None
        if event == "approval.requested":
            answerable = await _answerable(page, run_id, data.get("approval"))
        html = step.render(type=event, data=data, run=run, csrf=csrf, answerable=answerable)
        out = [sse("step", html, event_id)]
        if event == "run.finished":
            panel = await _panel(page, run_id)
            out.append(
                sse("finished", ENV.get_template("run_panel.html").render(**panel, csrf=csrf))
            )
        return out

    return await relay(page, f"/v1/runs/{run_id}/events", translate)


async def cancel(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    run_id = request.path_params["run_id"]
    answer = await page.call("POST", f"/v1/runs/{run_id}/cancel")
    if not answer.ok:
        raise PageError(answer, title="The run was not cancelled", me=page.me)
    return back(f"/runs/{run_id}")


async def artifact(request: Request) -> Response:
    """An artifact's bytes as the API sends them (its download is audited there)."""
    page = await Page.signed_in(request)
    run_id, name = request.path_params["run_id"], request.path_params["name"]
    streamed = await page.backend.stream(
        request, "GET", f"/v1/runs/{quote(run_id)}/artifacts/{quote(name, safe='/')}"
    )
    if not streamed.answer.ok:
        streamed.answer.body = b"".join([c async for c in streamed.chunks])
        await streamed.close()
        raise PageError(streamed.answer, title="No download", me=page.me)
    passed = {
        k: v
        for k, v in streamed.answer.headers.items()
        if k in ("content-type", "content-length", "content-disposition", "etag")
    }

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in streamed.chunks:
                yield chunk
        finally:
            await streamed.close()

    return StreamingResponse(body(), headers=passed)


async def approvals(request: Request) -> Response:
    page = await Page.signed_in(request)
    pending = await page.get("/v1/approvals")
    return page.render("approvals.html", approvals=pending)


async def decide(request: Request) -> Response:
    page = await Page.signed_in(request)
    await page.form()
    approval_id = request.path_params["approval_id"]
    decision = page.text("decision")
    answer = await page.call(
        "POST",
        f"/v1/approvals/{approval_id}",
        json_body={"decision": decision, "note": page.text("note") or None},
    )
    if not answer.ok:
        raise PageError(answer, title="The approval was not answered", me=page.me)
    return back(local_path(page.text("next"), "/approvals"))


def routes() -> list[Route]:
    return [
        Route("/agents", agents),
        Route("/agents/{agent_id}/run", run_form, methods=["GET"]),
        Route("/agents/{agent_id}/run", start_run, methods=["POST"]),
        Route("/runs", runs),
        Route("/runs/{run_id}", run_view),
        Route("/runs/{run_id}/stream", run_stream),
        Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
        Route("/runs/{run_id}/artifacts/{name:path}", artifact),
        Route("/approvals", approvals),
        Route("/approvals/{approval_id}", decide, methods=["POST"]),
    ]
