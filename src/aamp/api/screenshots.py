"""`POST /v1/sandboxes/{id}/screenshot`: a PNG of a web page, taken by the browser inside a
browser sandbox, through that sandbox's egress proxy and so under its policy's rules.

It is the agents' own `browser` tool (`BrowserTool`: open the URL, then screenshot), driven
by the host for the caller: what the page was refused is told by the host's proxy, never by
the guest or the page. A navigation the policy refuses is answered 422 `egress_refused`
naming the rule (not 403, which is the guard's alone: who may ask), and recorded as a
refusal (`sandbox.browser_result`, decision `deny`; the proxy's own ledger record is in the
audit log too); a screenshot taken is recorded with the URL it shows and its SHA-256.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from aamp.agents.browser_tool import BrowserTool
from aamp.api.body import Body
from aamp.api.errors import ApiError
from aamp.api.guard import cp_of, guarded_router, rule
from aamp.api.sandboxes import audit_sandbox, sandbox_resource

BROWSER_IMAGE = "browser"
SandboxId = Annotated[str, Path(min_length=1, max_length=64)]


class ScreenshotIn(Body):
    url: str = Field(pattern=r"^https?://", max_length=8192, description="the page to load")
    full_page: bool = Field(False, description="the whole page, not only the visible part")
    timeout_seconds: float = Field(30, gt=0, le=300, description="for loading the page")


class ScreenshotOut(BaseModel):
    url: str = Field(description="where the browser ended up (after redirects)")
    title: str
    status: int | None = Field(description="the page's HTTP status")
    sha256: str
    bytes: int
    png_b64: str


def router() -> APIRouter:
    r = guarded_router(prefix="/v1", tags=["sandboxes"])

    @r.post("/sandboxes/{sandbox_id}/screenshot", response_model=ScreenshotOut)
    @rule("sandbox.browser", sandbox_resource)
    async def screenshot(
        sandbox_id: SandboxId, body: ScreenshotIn, request: Request
    ) -> ScreenshotOut:
        manager = cp_of(request).manager
        # Wherever it runs (one on another host is reached over its link); 404 if nowhere.
        image = (await manager.find(sandbox_id)).image
        if image != BROWSER_IMAGE and not image.startswith("custom-"):
            raise ApiError(
                400,
                "invalid_request",
                f"sandbox {sandbox_id} runs the {image} image; a screenshot needs a browser "
                "sandbox (a policy with image: browser)",
            )
        asked = {"url": body.url, "full_page": body.full_page}
        await audit_sandbox(
            request, "sandbox.browser", sandbox_id, {"action": "screenshot", **asked}
        )
        tool = BrowserTool(
            lambda: manager.use(sandbox_id),
            int(body.timeout_seconds) + 30,
            egress=await manager.egress_view(sandbox_id),
        )
        opened = await tool.run(
            {"action": "open", "url": body.url, "timeout": body.timeout_seconds}
        )
        refused = opened.detail.get("refused")
        if refused is not None:
            await _result(request, sandbox_id, {**asked, "rule": refused["rule"]}, "deny")
            raise ApiError(
                422, "egress_refused", opened.text.splitlines()[0].removeprefix("error: ")
            )
        if opened.detail.get("status") is None and not opened.ok:
            await _result(request, sandbox_id, {**asked, "error": opened.text[:2000]}, "error")
            raise ApiError(
                502, "navigation_failed", f"{body.url} was not loaded: {opened.text[:2000]}"
            )
        shot = await tool.run({"action": "screenshot", "full_page": body.full_page})
        if shot.screenshot is None:
            await _result(request, sandbox_id, {**asked, "error": shot.text[:2000]}, "error")
            raise ApiError(502, "screenshot_failed", f"no screenshot was taken: {shot.text[:2000]}")
        png = shot.screenshot
        out = ScreenshotOut(
            url=str(shot.detail.get("url") or opened.detail.get("url") or body.url),
            title=str(shot.detail.get("title") or opened.detail.get("title") or ""),
            status=opened.detail.get("status"),
            sha256=hashlib.sha256(png).hexdigest(),
            bytes=len(png),
            png_b64=base64.b64encode(png).decode(),
        )
        shown = {
            "shown_url": out.url,
            "status": out.status,
            "sha256": out.sha256,
            "bytes": out.bytes,
        }
        await _result(request, sandbox_id, {**asked, **shown}, "info")
        return out

    return r


async def _result(
    request: Request, sandbox_id: str, details: dict[str, Any], decision: str
) -> None:
    await audit_sandbox(request, "sandbox.browser_result", sandbox_id, details, decision=decision)
